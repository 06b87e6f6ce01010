// Kimi chat template: renders a single-turn conversation into token ids.
//
//   [<|im_system|>system<|im_middle|>{system}<|im_end|>]
//   <|im_user|>user<|im_middle|>{user}<|im_end|>
//   <|im_assistant|>assistant<|im_middle|><think>          (thinking on)
//   <|im_assistant|>assistant<|im_middle|><think></think>  (thinking off)
// No [BOS] is emitted (the template does not emit one). The role names and the texts are
// encoded as ordinary text (special-token strings inside them are not recognized).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

// system: NULL (or "") for no system turn. *ids is malloc'ed (free() it). Returns -1 with a
// message when a special token the template needs is not in the vocabulary or a text is not
// valid UTF-8.
int chat_render(const k25_tokenizer *t, const char *system, const char *user, int thinking,
                int32_t **ids, size_t *n, char *err);

#ifdef __cplusplus
}
#endif
