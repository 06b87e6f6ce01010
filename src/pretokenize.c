// Pre-tokenization with PCRE2: Rust-regex -> PCRE2 pattern translation and the match loop.
//
// tiktoken compiles its pattern with Rust's fancy_regex. PCRE2 (10.42) agrees with it on the
// backtracking semantics the tokenizer patterns use (alternation order, greedy and possessive
// quantifiers, lookahead, (?i:...) with Unicode case folding), but differs in a few places
// that the translation fixes:
//   - class set operations: Rust has [A&&B] (intersection) and [A--B] (difference); PCRE2
//     10.42 has neither. One class operand is kept as a class and the others become
//     lookaheads: [A&&[^B]] -> (?:(?![B])[A]), [A&&B] -> (?:(?=[B])[A]), [A--B] -> (?:(?![B])[A]).
//     Nested classes are unions. Symmetric difference (~~) is rejected.
//   - \s / \S: Rust means the Unicode White_Space property; PCRE2's UCP \s also matches
//     U+180E. Outside classes and as a positive item inside a class, \s is spelled out as the
//     White_Space list. (\S inside a class stays PCRE2's.)
//   - \d: Rust means \p{Nd}, spelled out the same way.
//   - \w: Rust means Alphabetic, marks, Nd, Pc and Join_Control; PCRE2 10.42's UCP \w is L, N
//     and '_' (it splits a letter from its combining accent and takes ² or ½). \w, and \W
//     outside classes, are spelled out; \b and \B become lookarounds on that class.
//   - POSIX classes ([[:alpha:]]) are ASCII in Rust, Unicode in PCRE2 with UCP: they become
//     their ASCII ranges. Negated ones ([[:^alpha:]]) are rejected.
//   - \p{Script}: Rust matches the Script property, PCRE2 >= 10.40 a bare script name matches
//     Script_Extensions (\p{Han} would take 、。「 too), so bare script names become \p{sc:Name}.
//   - \uXXXX, \u{X}, \UXXXXXXXX -> \x{X}; $ means end of text (PCRE2_DOLLAR_ENDONLY); '.' stops at
//     \n only (newline convention LF).
// Limits: \S and \W inside a class keep PCRE2's UCP meaning (close to Rust's, not identical);
// Rust-only syntax not listed here is passed through and PCRE2 may reject it.
// Property tables come from the libraries' Unicode versions (PCRE2 10.42: Unicode 14); the two
// agree except on code points assigned after that. A pattern that matches the empty string
// makes tiktoken panic; here empty matches produce no piece.
#include "pretokenize.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common.h"
#include "tokenizer.h"

// The Unicode White_Space property, as class items.
#define WS_ITEMS "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
// Rust's Unicode \w, as class items.
#define WORD_ITEMS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}"
#define WORD "[" WORD_ITEMS "]"
#define NOT_WORD "[^" WORD_ITEMS "]"

const char *const K25_KIMI_PATTERN =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

// ----------------------------------------------------------------------------
// A growable string

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) K25_DIE("out of memory translating a pattern");
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }
static void sb_printf(sbuf *b, const char *fmt, ...) K25_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_putn(b, tmp, n < (int)sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

// ----------------------------------------------------------------------------
// Escapes

static int is_general_category(const char *name, size_t n) {
    static const char *const gc[] = {"L",  "LC", "L&", "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",
                                     "Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm",
                                     "Sc", "Sk", "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn",
                                     "Any"};
    for (size_t i = 0; i < sizeof gc / sizeof *gc; i++)
        if (strlen(gc[i]) == n && memcmp(gc[i], name, n) == 0) return 1;
    return 0;
}

static int pcre2_accepts(const char *pattern) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) return 0;
    pcre2_code_free(re);
    return 1;
}

// Writes \p{...} / \P{...} for a Rust property name.
static void put_property(sbuf *b, int negated, const char *name, size_t n) {
    sb_puts(b, negated ? "\\P{" : "\\p{");
    const char *sep = NULL;
    for (size_t i = 0; i < n; i++)
        if (name[i] == '=' || name[i] == ':') {
            sep = name + i;
            break;
        }
    if (sep) {
        size_t kn = (size_t)(sep - name);
        const char *val = sep + 1;
        size_t vn = n - kn - 1;
#define KEY_IS(k) (kn == strlen(k) && strncasecmp(name, k, kn) == 0)
        if (KEY_IS("sc") || KEY_IS("script"))
            sb_puts(b, "sc:");
        else if (KEY_IS("scx") || KEY_IS("script_extensions"))
            sb_puts(b, "scx:");
        else if (!(KEY_IS("gc") || KEY_IS("general_category")))
            sb_putn(b, name, kn + 1);
#undef KEY_IS
        sb_putn(b, val, vn);
    } else if (is_general_category(name, n)) {
        sb_putn(b, name, n);
    } else {
        // A bare script name: Script in Rust, Script_Extensions in PCRE2. Other names (binary
        // properties) pass through.
        char probe[160];
        int pn = snprintf(probe, sizeof probe, "\\p{sc:%.*s}", (int)n, name);
        if (pn < (int)sizeof probe && pcre2_accepts(probe)) sb_puts(b, "sc:");
        sb_putn(b, name, n);
    }
    sb_puts(b, "}");
}

// Translates the escape at p[*i] (a backslash). in_class: inside [...]. Returns -1 on error.
static int put_escape(sbuf *b, const char *p, size_t *i, int in_class, char *err) {
    size_t j = *i + 1;
    char c = p[j];
    if (!c) return k25_err(err, "pattern ends with a backslash");
    if (c == 'p' || c == 'P') {
        const char *name;
        size_t n;
        if (p[j + 1] == '{') {
            const char *close = strchr(p + j + 2, '}');
            if (!close) return k25_err(err, "unterminated \\%c{ at pattern offset %zu", c, *i);
            name = p + j + 2;
            n = (size_t)(close - name);
            *i = (size_t)(close - p) + 1;
        } else {
            if (!p[j + 1]) return k25_err(err, "\\%c without a property name at pattern offset %zu", c, *i);
            name = p + j + 1;
            n = 1;
            *i = j + 2;
        }
        put_property(b, c == 'P', name, n);
        return 0;
    }
    *i = j + 1;
    switch (c) {
    case 's':
        sb_puts(b, in_class ? WS_ITEMS : "[" WS_ITEMS "]");
        return 0;
    case 'S':
        sb_puts(b, in_class ? "\\S" : "[^" WS_ITEMS "]");
        return 0;
    case 'd': sb_puts(b, "\\p{Nd}"); return 0;
    case 'w':
        sb_puts(b, in_class ? WORD_ITEMS : WORD);
        return 0;
    case 'W':
        sb_puts(b, in_class ? "\\W" : NOT_WORD);
        return 0;
    case 'b':
    case 'B':
        if (in_class) break;
        // Start or end of text counts as a non-word side, as in Rust.
        sb_puts(b, c == 'b' ? "(?:(?<=" WORD ")(?!" WORD ")|(?<!" WORD ")(?=" WORD "))"
                            : "(?:(?<=" WORD ")(?=" WORD ")|(?<!" WORD ")(?!" WORD "))");
        return 0;
    case 'D': sb_puts(b, "\\P{Nd}"); return 0;
    case 'u':
    case 'U': {
        // \u{X} / \uXXXX / \U{X} / \UXXXXXXXX
        size_t k = j + 1, n;
        const char *hex;
        if (p[k] == '{') {
            const char *close = strchr(p + k + 1, '}');
            if (!close) return k25_err(err, "unterminated \\%c{ at pattern offset %zu", c, j - 1);
            hex = p + k + 1;
            n = (size_t)(close - hex);
            *i = (size_t)(close - p) + 1;
        } else {
            n = c == 'u' ? 4 : 8;
            for (size_t q = 0; q < n; q++)
                if (!p[k + q]) return k25_err(err, "truncated \\%c escape at pattern offset %zu", c, j - 1);
            hex = p + k;
            *i = k + n;
        }
        sb_printf(b, "\\x{%.*s}", (int)n, hex);
        return 0;
    }
    default:
        break;
    }
    sb_putn(b, p + j - 1, 2);
    return 0;
}

// A POSIX class [:name:] (name n bytes) as its ASCII ranges, which is what Rust means by it.
static int put_posix(sbuf *b, const char *name, size_t n, size_t at, char *err) {
    static const struct { const char *name, *items; } posix[] = {
        {"alnum", "0-9A-Za-z"}, {"alpha", "A-Za-z"},     {"ascii", "\\x{0}-\\x{7F}"},
        {"blank", "\\t "},       {"cntrl", "\\x{0}-\\x{1F}\\x{7F}"}, {"digit", "0-9"},
        {"graph", "!-~"},       {"lower", "a-z"},        {"print", " -~"},
        {"punct", "!-/:-@\\[-`{-~"}, {"space", "\\t\\n\\x{B}\\f\\r "}, {"upper", "A-Z"},
        {"word", "0-9A-Za-z_"}, {"xdigit", "0-9A-Fa-f"},
    };
    if (n && name[0] == '^')
        return k25_err(err, "negated POSIX class [:%.*s:] at pattern offset %zu is not supported",
                       (int)n, name, at);
    for (size_t k = 0; k < sizeof posix / sizeof *posix; k++)
        if (strlen(posix[k].name) == n && memcmp(posix[k].name, name, n) == 0) {
            sb_puts(b, posix[k].items);
            return 0;
        }
    return k25_err(err, "unknown POSIX class [:%.*s:] at pattern offset %zu", (int)n, name, at);
}

// ----------------------------------------------------------------------------
// Classes

// One class operand as PCRE2 text matching exactly one code point. simple: a plain union of
// items, held (without brackets) in items, mergeable into an enclosing union. neg_simple: the
// expression is [^items].
typedef struct class_expr {
    sbuf expr;
    sbuf items;
    int simple, neg_simple;
} class_expr;

static void class_expr_free(class_expr *e) {
    free(e->expr.s);
    free(e->items.s);
    memset(e, 0, sizeof *e);
}

static int parse_class(const char *p, size_t *i, class_expr *out, char *err);

// Parses one operand (a union of items and nested classes) up to "&&", "--" or the closing
// bracket.
static int parse_operand(const char *p, size_t *i, int first, class_expr *out, char *err) {
    sbuf items = {0}, alts = {0}; // alts: "|"-joined nested classes that cannot be merged as items
    class_expr only = {0};        // the operand's single nested class, when that is all it has
    int n_nested = 0, rc = -1;
    for (;;) {
        char c = p[*i];
        if (!c) {
            k25_err(err, "unterminated character class in pattern");
            goto out;
        }
        if (c == ']' && !first) break;
        if ((c == '&' && p[*i + 1] == '&') || (c == '-' && p[*i + 1] == '-')) break;
        if (c == '~' && p[*i + 1] == '~') {
            k25_err(err, "class symmetric difference (~~) at pattern offset %zu is not supported", *i);
            goto out;
        }
        first = 0;
        if (c == '\\') {
            if (put_escape(&items, p, i, 1, err)) goto out;
        } else if (c == '[' && p[*i + 1] == ':') {
            const char *close = strstr(p + *i + 2, ":]");
            if (!close) {
                k25_err(err, "unterminated POSIX class at pattern offset %zu", *i);
                goto out;
            }
            if (put_posix(&items, p + *i + 2, (size_t)(close - (p + *i + 2)), *i, err)) goto out;
            *i = (size_t)(close + 2 - p);
        } else if (c == '[') {
            class_expr nested = {0};
            if (parse_class(p, i, &nested, err)) {
                class_expr_free(&nested);
                goto out;
            }
            n_nested++;
            const char *ni = nested.items.s;
            size_t nn = nested.items.n;
            if (nested.simple && ni[0] != '-' && ni[nn - 1] != '-') {
                sb_puts(&items, ni); // a union of plain classes is one class
            } else {
                if (alts.n) sb_puts(&alts, "|");
                sb_puts(&alts, nested.expr.s);
            }
            class_expr_free(&only);
            only = nested;
        } else {
            if (c == '^' || c == ']') sb_puts(&items, "\\"); // literal wherever the items end up
            sb_putn(&items, &c, 1);
            (*i)++;
        }
    }
    if (!items.n && !alts.n) {
        k25_err(err, "empty class operand at pattern offset %zu", *i);
        goto out;
    }
    if (n_nested == 1 && !alts.n && items.n == only.items.n) { // just [X]: keep its form
        *out = only;
        only = (class_expr){0};
        rc = 0;
        goto out;
    }
    if (n_nested == 1 && alts.n && !items.n) { // just [^X] or an intersection
        *out = only;
        only = (class_expr){0};
        rc = 0;
        goto out;
    }
    out->simple = !alts.n;
    if (items.n) {
        sb_puts(&out->items, items.s);
        sb_printf(&out->expr, "[%s]", items.s);
    }
    if (alts.n) {
        sbuf e = {0};
        sb_puts(&e, "(?:");
        if (out->expr.n) sb_printf(&e, "%s|", out->expr.s);
        sb_printf(&e, "%s)", alts.s);
        free(out->expr.s);
        out->expr = e;
    }
    rc = 0;
out:
    class_expr_free(&only);
    free(items.s);
    free(alts.s);
    return rc;
}

// Parses [...] starting at p[*i] == '['; leaves *i after the closing bracket.
static int parse_class(const char *p, size_t *i, class_expr *out, char *err) {
    (*i)++;
    int negated = 0;
    if (p[*i] == '^') negated = 1, (*i)++;
    class_expr acc = {0};
    if (parse_operand(p, i, 1, &acc, err)) {
        class_expr_free(&acc);
        return -1;
    }
    while (p[*i] != ']') {
        int intersect = p[*i] == '&';
        *i += 2;
        class_expr rhs = {0};
        if (parse_operand(p, i, 0, &rhs, err)) {
            class_expr_free(&rhs);
            class_expr_free(&acc);
            return -1;
        }
        // The left side consumes the code point; a lookahead checks membership in the right
        // side. x in [^B] is "not x in [B]", so a negated right side flips the lookahead.
        sbuf e = {0};
        if (rhs.neg_simple)
            sb_printf(&e, "(?:(?%c[%s])%s)", intersect ? '!' : '=', rhs.items.s, acc.expr.s);
        else
            sb_printf(&e, "(?:(?%c%s)%s)", intersect ? '=' : '!', rhs.expr.s, acc.expr.s);
        class_expr_free(&rhs);
        class_expr_free(&acc);
        acc = (class_expr){.expr = e};
    }
    (*i)++;
    if (!negated) {
        *out = acc;
        return 0;
    }
    *out = (class_expr){0};
    if (acc.simple) {
        sb_printf(&out->expr, "[^%s]", acc.items.s);
        sb_puts(&out->items, acc.items.s);
        out->neg_simple = 1;
    } else if (acc.neg_simple) { // [^[^X]] is [X]
        sb_printf(&out->expr, "[%s]", acc.items.s);
        sb_puts(&out->items, acc.items.s);
        out->simple = 1;
    } else {
        sb_printf(&out->expr, "(?:(?!%s)(?s:.))", acc.expr.s);
    }
    class_expr_free(&acc);
    return 0;
}

char *tokenizer_translate_pattern(const char *rust, char *err) {
    sbuf b = {0};
    sb_puts(&b, "");
    for (size_t i = 0; rust[i];) {
        char c = rust[i];
        if (c == '\\') {
            if (put_escape(&b, rust, &i, 0, err)) goto fail;
        } else if (c == '[') {
            class_expr e = {0};
            if (parse_class(rust, &i, &e, err)) {
                class_expr_free(&e);
                goto fail;
            }
            sb_puts(&b, e.expr.s);
            class_expr_free(&e);
        } else {
            sb_putn(&b, &c, 1);
            i++;
        }
    }
    return b.s;
fail:
    free(b.s);
    return NULL;
}

// ----------------------------------------------------------------------------
// Compile and match

int pretok_compile(pretok *p, const char *rust_pattern, char *err) {
    memset(p, 0, sizeof *p);
    char terr[K25_ERR_LEN];
    p->pattern = tokenizer_translate_pattern(rust_pattern, terr);
    if (!p->pattern) return k25_err(err, "tokenizer pattern: %s", terr);
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p->pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        k25_err(err, "tokenizer pattern: PCRE2 rejects the translated pattern at offset %zu: %s (translated: %.200s)",
                (size_t)eo, (const char *)msg, p->pattern);
        free(p->pattern);
        p->pattern = NULL;
        return -1;
    }
    p->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    p->re = re;
    return 0;
}

void pretok_free(pretok *p) {
    if (p->re) pcre2_code_free((pcre2_code *)p->re);
    free(p->pattern);
    memset(p, 0, sizeof *p);
}

void pretok_begin(const pretok *p, pretok_state *st) {
    st->md = pcre2_match_data_create_from_pattern((pcre2_code *)p->re, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    if (!st->md || !mc) K25_DIE("out of memory creating PCRE2 match data");
    // Repeated lookahead groups (the translated class intersections) keep a backtracking
    // frame per code point and runs reach 25,000 code points, so the matcher gets room (the
    // JIT stack is reserved address space, touched only as deep as a match goes).
    pcre2_jit_stack *js = p->jit ? pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, NULL) : NULL;
    if (js) pcre2_jit_stack_assign(mc, NULL, js);
    pcre2_set_heap_limit(mc, 4u << 20); // KiB, for the interpreter when there is no JIT
    pcre2_set_match_limit(mc, 1000000000u);
    st->mc = mc;
    st->js = js;
}

void pretok_end(pretok_state *st) {
    if (st->js) pcre2_jit_stack_free(st->js);
    pcre2_match_context_free(st->mc);
    pcre2_match_data_free(st->md);
    memset(st, 0, sizeof *st);
}

int pretok_split(const pretok *p, pretok_state *st, const unsigned char *s, size_t len, pretok_piece_fn fn, void *ctx,
                 char *err) {
    pcre2_code *re = p->re;
    pcre2_match_data *md = st->md;
    size_t pos = 0;
    while (pos < len) {
        int m = pcre2_match(re, s, len, pos, PCRE2_NO_UTF_CHECK, md, st->mc);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return k25_err(err, "pre-tokenizer match failed at byte offset %zu: %s", pos, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (b <= a) { // empty match: step over one code point
            pos = a + 1;
            while (pos < len && (s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (fn(ctx, s + a, b - a, err)) return -1;
        pos = b;
    }
    return 0;
}
