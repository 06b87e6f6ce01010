// A configuration file's JSON text as one object, read strictly. A key that an object holds
// twice is refused: cJSON's lookups see the first occurrence, Python's json (and so
// transformers) the last, so a reader that takes either disagrees with the other without a word.
#pragma once
#include <stddef.h>

#include <cjson/cJSON.h>

// len bytes of text (no NUL needed) as a JSON object in which no object, at any depth, holds a
// key twice, followed by nothing but white space; to cJSON_Delete. NULL with "NAME: invalid
// JSON (near byte N)", "NAME: data after the JSON object (byte N)", "NAME: expected a JSON
// object" or "NAME: key 'a.b' appears more than once" in err.
cJSON *json_parse_object(const char *text, size_t len, const char *name, char *err);
