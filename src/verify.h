// Checkpoint integrity for --verify: a CRC-32 manifest "k25-manifest.crc32" in the checkpoint
// directory, one line per safetensors file: "<crc32 as 8 hex digits> <size in bytes> <name>".
//
// The manifest is written once from a copy known to be good (k25-mkckpt writes it with every
// checkpoint it makes; `k25-mkckpt --manifest DIR` adds one to a downloaded checkpoint).
// Verifying a directory without a manifest is an error that says how to create one: a check
// that was asked for and cannot run must not pass silently.
#pragma once
#include "common.h"

#define VERIFY_MANIFEST "k25-manifest.crc32"

#ifdef __cplusplus
extern "C" {
#endif

// Writes the manifest for every *.safetensors file of dir (replacing an old one).
int verify_write_manifest(const char *dir, char *err);
// Checks every file of the manifest (present, size, CRC-32) and that every *.safetensors file
// of dir is listed. err names the first missing or mismatching file.
int verify_checkpoint(const char *dir, char *err);
// The same over a share of the files (manifest lines i with i % n_parts == part), so ranks can
// split the reading; the listing checks run in every part.
int verify_checkpoint_part(const char *dir, int part, int n_parts, char *err);

#ifdef __cplusplus
}
#endif
