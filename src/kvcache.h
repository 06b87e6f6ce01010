// Paged allocator of the MLA latent cache: which physical blocks of kv_block tokens each
// sequence slot holds, as the block table k25_batch hands to the model. The cache memory itself
// lives in the backend (kv_init); this file only decides who owns which block.
//
// Admission promises: a sequence is opened with the most positions it will ever hold, and the
// allocator promises it that many blocks (they may be taken lazily, as the sequence grows). A
// new sequence is opened only when the free blocks cover every promise already made plus its
// own, so a running sequence can always grow to its promised length and is never starved or
// made to share a block.
//
// Speculative decoding rolls positions back (rejected drafts): kvcache_truncate shortens a
// sequence; blocks wholly past the new length return to the pool but stay promised, so the
// sequence can grow back.
#pragma once
#include "common.h"

typedef struct k25_kvcache {
    int n_blocks;            // physical blocks in the cache
    int kv_block;            // tokens per block
    int max_seqs;            // sequence slots
    int max_blocks_per_seq;  // block table row width
    int32_t *block_table;    // [max_seqs][max_blocks_per_seq]: physical block, -1 where unheld
    int *len;                // [max_seqs]: positions the slot covers (0 .. len-1)
    int *held;               // [max_seqs]: blocks held (table entries 0 .. held-1 are valid)
    int *promised;           // [max_seqs]: blocks promised at kvcache_open
    uint8_t *open;           // [max_seqs]: slot in use
    int32_t *free_stack;     // [n_blocks]: free block ids, top at n_free-1
    int n_free;
    int owed;                // sum over slots of max(0, promised - held)
} k25_kvcache;

#ifdef __cplusplus
extern "C" {
#endif

// Returns 0, or -1 with a message in err (non-positive sizes).
int kvcache_init(k25_kvcache *c, int n_blocks, int kv_block, int max_seqs,
                 int max_blocks_per_seq, char *err);
void kvcache_destroy(k25_kvcache *c);

// Blocks that hold n_tokens positions.
int kvcache_blocks_for(const k25_kvcache *c, int n_tokens);
// Blocks a newly opened sequence could be promised now.
int kvcache_available(const k25_kvcache *c);
// Whether a sequence of max_tokens positions could ever fit (table width and cache size).
int kvcache_fits(const k25_kvcache *c, int max_tokens);

// Opens free slot `slot` for a sequence of at most max_tokens positions, length 0. Returns 0,
// or -1 when the slot is in use, the sequence can never fit, or not enough blocks are free now
// (the caller waits for others to close).
int kvcache_open(k25_kvcache *c, int slot, int max_tokens);
// Makes positions 0 .. n_tokens-1 addressable (length := max(length, n_tokens)). Blocks within
// the promise always come; blocks beyond it only when unpromised blocks are free. Returns 0 or
// -1 (nothing changed).
int kvcache_grow(k25_kvcache *c, int slot, int n_tokens);
// Shortens the slot to n_tokens positions (n_tokens <= length). Blocks past the new length go
// back to the pool.
void kvcache_truncate(k25_kvcache *c, int slot, int n_tokens);
// Frees every block of the slot and its promise.
void kvcache_close(k25_kvcache *c, int slot);

// Checks the allocator's invariants (every block free or held exactly once, counts agree).
// Returns 0, or -1 with a message in err. For tests and debug builds.
int kvcache_check(const k25_kvcache *c, char *err);

#ifdef __cplusplus
}
#endif
