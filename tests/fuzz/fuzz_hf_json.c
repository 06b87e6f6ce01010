// Fuzz target: the Hugging Face config.json reader (config_load_hf_json_string), both the
// Kimi-K2.5 wrapper (text_config + quantization_config) and plain DeepseekV3 / kimi_k2 files.
//
// The input is handed over with its exact length and no terminating NUL, so a read past the
// end is caught. A rejected file leaves the configuration untouched and says why, naming
// config.json; an accepted one is checked by fuzz_check_config.
#include "config.h"
#include "fuzz_common.h"
#include "fuzz_config_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    k25_config c, before;
    config_init_defaults(&c);
    before = c;
    char err[K25_ERR_LEN];
    err[0] = 0;
    if (config_load_hf_json_string(&c, (const char *)data, size, "config.json", err)) {
        if (strncmp(err, "config.json", 11)) fuzz_fail("message does not name the file: '%s'", err);
        const char *diff = fuzz_config_diff(&before, &c);
        if (diff) fuzz_fail("rejected file still changed %s", diff);
    } else {
        fuzz_check_config(&c);
    }
    return 0;
}
