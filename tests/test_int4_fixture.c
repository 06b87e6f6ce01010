// INT4 packing against compressed-tensors: src/int4.h must pack the fixture's q values into the
// exact words the library's pack_to_int32 produced, unpack them back, and dequantize to the
// library's q * scale bit for bit (tests/data/int4_fixture/int4_pack.txt, written by
// scripts/golden/make_int4_fixture.py).
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "int4.h"
#include "test_util.h"

#define FIXTURE "tests/data/int4_fixture/int4_pack.txt"
#define MAX_ROWS 64
#define MAX_COLS 256


typedef struct fixture {
    int rows, cols;
    int q[MAX_ROWS][MAX_COLS];
    uint32_t packed[MAX_ROWS][MAX_COLS / 8];
    uint16_t scale[MAX_ROWS][MAX_COLS / 32];
    uint32_t dequant[MAX_ROWS][MAX_COLS];   // float32 bit patterns
    char version[64];
} fixture;

// ------------------------------------------------------------------------------------------
// Fixture reader
// ------------------------------------------------------------------------------------------

// Next whitespace-separated token that is not inside a '#' comment line.
static int next_token(FILE *f, char *tok, size_t n) {
    for (;;) {
        if (fscanf(f, " ") == EOF) return -1;
        int c = fgetc(f);
        if (c == EOF) return -1;
        if (c == '#') {
            while ((c = fgetc(f)) != EOF && c != '\n') {}
            continue;
        }
        ungetc(c, f);
        char fmt[16];
        snprintf(fmt, sizeof fmt, "%%%zus", n - 1);
        return fscanf(f, fmt, tok) == 1 ? 0 : -1;
    }
}

static int expect_word(FILE *f, const char *want) {
    char tok[64];
    if (next_token(f, tok, sizeof tok) || strcmp(tok, want) != 0) {
        fprintf(stderr, "%s: expected '%s'\n", FIXTURE, want);
        return -1;
    }
    return 0;
}

static int read_ulong(FILE *f, unsigned long *v) {
    char tok[64], *end;
    if (next_token(f, tok, sizeof tok)) return -1;
    *v = strtoul(tok, &end, 0);
    return *end ? -1 : 0;
}

static int read_fixture(fixture *fx) {
    FILE *f = fopen(FIXTURE, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s (run from the repository root)\n", FIXTURE);
        return -1;
    }
    char tok[64];
    unsigned long v;
    int rc = -1;
    if (expect_word(f, "K25INT4FIXTURE") || read_ulong(f, &v) || v != 1) goto out;
    if (expect_word(f, "compressed_tensors") || next_token(f, fx->version, sizeof fx->version))
        goto out;
    if (expect_word(f, "torch") || next_token(f, tok, sizeof tok)) goto out;
    if (expect_word(f, "rows") || read_ulong(f, &v) || v == 0 || v > MAX_ROWS) goto out;
    fx->rows = (int)v;
    if (expect_word(f, "cols") || read_ulong(f, &v) || v == 0 || v > MAX_COLS || v % 32) goto out;
    fx->cols = (int)v;
    if (expect_word(f, "q")) goto out;
    for (int n = 0; n < fx->rows; n++)
        for (int k = 0; k < fx->cols; k++) {
            if (next_token(f, tok, sizeof tok)) goto out;
            fx->q[n][k] = atoi(tok);
        }
    if (expect_word(f, "packed")) goto out;
    for (int n = 0; n < fx->rows; n++)
        for (int j = 0; j < fx->cols / 8; j++) {
            if (read_ulong(f, &v)) goto out;
            fx->packed[n][j] = (uint32_t)v;
        }
    if (expect_word(f, "scale")) goto out;
    for (int n = 0; n < fx->rows; n++)
        for (int g = 0; g < fx->cols / 32; g++) {
            if (read_ulong(f, &v)) goto out;
            fx->scale[n][g] = (uint16_t)v;
        }
    if (expect_word(f, "dequant")) goto out;
    for (int n = 0; n < fx->rows; n++)
        for (int k = 0; k < fx->cols; k++) {
            if (read_ulong(f, &v)) goto out;
            fx->dequant[n][k] = (uint32_t)v;
        }
    rc = next_token(f, tok, sizeof tok) == -1 ? 0 : -1;   // nothing may follow
out:
    if (rc) fprintf(stderr, "%s: malformed fixture\n", FIXTURE);
    fclose(f);
    return rc;
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

// ------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------

static void check_codes(const fixture *fx) {
    int seen[16] = {0};
    for (int n = 0; n < fx->rows; n++)
        for (int k = 0; k < fx->cols; k++) {
            int q = fx->q[n][k];
            EXPECT(q >= -8 && q <= 7, "q[%d][%d] = %d out of range", n, k, q);
            if (q >= -8 && q <= 7) seen[q + 8] = 1;
        }
    for (int i = 0; i < 16; i++) EXPECT(seen[i], "fixture lacks the code %d", i - 8);
}

static void check_pack_unpack(const fixture *fx) {
    for (int n = 0; n < fx->rows; n++)
        for (int j = 0; j < fx->cols / 8; j++) {
            uint32_t w = int4_pack8(&fx->q[n][8 * j]);
            EXPECT(w == fx->packed[n][j], "row %d word %d: int4_pack8 0x%08" PRIx32
                   ", compressed-tensors 0x%08" PRIx32, n, j, w, fx->packed[n][j]);
            for (int i = 0; i < 8; i++) {
                int q = int4_unpack(fx->packed[n][j], i);
                EXPECT(q == fx->q[n][8 * j + i], "row %d col %d: int4_unpack %d, expected %d", n,
                       8 * j + i, q, fx->q[n][8 * j + i]);
            }
        }
}

static void check_dequant(const fixture *fx) {
    float row[MAX_COLS];
    for (int n = 0; n < fx->rows; n++) {
        int4_dequant(fx->packed[n], fx->scale[n], fx->cols, row);
        for (int k = 0; k < fx->cols; k++) {
            EXPECT(f32_bits(row[k]) == fx->dequant[n][k],
                   "row %d col %d: int4_dequant 0x%08" PRIx32 ", compressed-tensors 0x%08" PRIx32,
                   n, k, f32_bits(row[k]), fx->dequant[n][k]);
            float at = int4_dequant_at(fx->packed[n], fx->scale[n], k);
            EXPECT(f32_bits(at) == fx->dequant[n][k], "row %d col %d: int4_dequant_at differs", n,
                   k);
        }
    }
}

int main(void) {
    static fixture fx;
    if (read_fixture(&fx)) return 1;
    check_codes(&fx);
    check_pack_unpack(&fx);
    check_dequant(&fx);
    if (test_failures) {
        fprintf(stderr, "%d failures\n", test_failures);
        return 1;
    }
    printf("int4 fixture (compressed-tensors %s): %d x %d packed, unpacked and dequantized "
           "identically\n", fx.version, fx.rows, fx.cols);
    return 0;
}
