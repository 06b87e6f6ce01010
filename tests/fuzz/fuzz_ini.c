// Fuzz target: the .ini configuration reader (config_load_ini_string).
//
// Beyond "no crash, no leak, no undefined behaviour": a rejected file leaves the
// configuration untouched and says why, naming the file; an accepted one is checked by
// fuzz_check_config (validation, tensor-parallel checks, --dump-config round trip).
#include "config.h"
#include "fuzz_common.h"
#include "fuzz_config_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    k25_config c, before;
    config_init_defaults(&c);
    before = c;
    char err[K25_ERR_LEN];
    err[0] = 0;
    if (config_load_ini_string(&c, text, "fuzz.ini", err)) {
        if (strncmp(err, "fuzz.ini", 8)) fuzz_fail("message does not name the file: '%s'", err);
        const char *diff = fuzz_config_diff(&before, &c);
        if (diff) fuzz_fail("rejected file still changed %s", diff);
    } else {
        fuzz_check_config(&c);
    }
    free(text);
    return 0;
}
