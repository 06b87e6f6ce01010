// JSON objects that hold a key twice. cJSON's lookups see the first occurrence, Python's json
// (and so transformers) the last: a reader that takes either disagrees with the other without a
// word, so configuration files with a repeated key are refused.
#pragma once
#include <cjson/cJSON.h>

// 0 when no object in v (at any depth) holds a key twice; else -1 with
// "NAME: key 'a.b' appears more than once" in err.
int json_check_unique_keys(const cJSON *v, const char *name, char *err);
