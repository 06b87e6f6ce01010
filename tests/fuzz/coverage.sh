#!/usr/bin/env bash
# Source line coverage reached by the fuzz corpora: builds the targets again with clang's
# source-based coverage (in ${BUILD}-cov, no sanitizers), runs each once over its corpora
# (the seeds in tests/fuzz/corpus/<target>/ and what tests/fuzz/run.sh collected in
# $BUILD/fuzz/work/<target>/corpus) and prints, per target, the line coverage of the files
# it exercises. Used for the figures in tests/fuzz/RESULTS.md.
#
#   tests/fuzz/coverage.sh [TARGET...]        Env: BUILD (default build-fuzz)
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build-fuzz}
cov=${BUILD}-cov
profdata=$(command -v llvm-profdata || command -v llvm-profdata-14) || { echo "llvm-profdata not found"; exit 1; }
llvmcov=$(command -v llvm-cov || command -v llvm-cov-14) || { echo "llvm-cov not found"; exit 1; }
mkdir -p "$cov"
make BUILD="$cov" FUZZ_SAN="-fprofile-instr-generate -fcoverage-mapping" -j2 fuzz >"$cov/build.log" 2>&1 ||
    { echo "build failed:"; tail -20 "$cov/build.log"; exit 1; }
if [ $# -gt 0 ]; then targets=("$@"); else
    targets=(); for f in tests/fuzz/fuzz_*.c; do t=${f##*/fuzz_}; targets+=("${t%.c}"); done
fi
[ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] && export TMPDIR=/dev/shm
# The functions that are the parser proper, per target (the files also hold other code).
declare -A parse_fns=(
    [ini]="config_load_ini_string ini_read_line ini_on_key ini_fail set_value parse_int parse_float parse_bool parse_ints find_key"
    [hf_json]="hf_load hf_model hf_rope hf_tokens hf_quant hf_set_typed json_int json_float json_bool json_str jget json_parse_object check_keys"
    [eagle3_config]="eagle3_config_parse parse_root check_variant read_aux read_layer opt_int opt_bool is_int present type_err set_num json_parse_object check_keys"
    [cli]="cli_parse find_flag parse_tokens parse_int parse_float cli_load_config config_set trim_copy"
    [safetensors]="st_parse_buffer st_parse_header parse_entry parse_metadata check_layout json_u64 st_find"
    [index]="read_index checkpoint_open bad_shard_name checkpoint_find find_exact"
    [tiktoken]="bpe_vocab_parse b64_decode b64_value hash_insert bpe_rank bpe_encode_piece bpe_merge_scan bpe_merge_heap"
    [tokenizer_config]="load_config_names finish_specials set_special tokenizer_load"
    [tokenize]="tokenizer_encode encode_slice encode_piece find_special utf8_valid_prefix utf8_next py_isspace pretok_split bpe_encode_piece"
    [detok]="detok_push detok_flush push_byte continues seq_len put"
    [pattern]="tokenizer_translate_pattern pretok_compile put_escape parse_class put_property is_general_category"
)
printf '%-18s %-22s %s\n' target file "lines covered"
for t in "${targets[@]}"; do
    bin=$cov/fuzz/fuzz_$t
    dirs=("tests/fuzz/corpus/$t")
    [ -d "$BUILD/fuzz/work/$t/corpus" ] && dirs+=("$BUILD/fuzz/work/$t/corpus")
    rm -f "$cov/$t".prof*
    LLVM_PROFILE_FILE="$cov/$t.profraw" "$bin" -runs=0 "${dirs[@]}" >"$cov/$t.runlog" 2>&1
    "$profdata" merge -sparse "$cov/$t.profraw" -o "$cov/$t.profdata" || continue
    # Files under src/ that the target executed at all.
    "$llvmcov" report "$bin" -instr-profile="$cov/$t.profdata" 2>/dev/null |
        awk -v t="$t" '$1 ~ /^src\// && $(NF-5) > 0 && $(NF-3) != "0.00%" {
            # columns: ... Lines MissedLines Cover Branches MissedBranches Cover
            printf "%-18s %-22s %s of %s (%s)\n", t, $1, $(NF-5)-$(NF-4), $(NF-5), $(NF-3) }'
    fns=${parse_fns[$t]:-}
    [ -z "$fns" ] && continue
    files=$(sed -n 's/^\(src\/[a-z0-9_]*\.c\).*/\1/p' < <("$llvmcov" report "$bin" -instr-profile="$cov/$t.profdata" 2>/dev/null))
    # shellcheck disable=SC2086
    "$llvmcov" report -show-functions "$bin" -instr-profile="$cov/$t.profdata" $files 2>/dev/null |
        awk -v t="$t" -v fns="$fns" '
            BEGIN { n = split(fns, a, " "); for (i = 1; i <= n; i++) want[a[i]] = 1 }
            NF >= 10 && $2 ~ /^[0-9]+$/ { name = $1; sub(/^.*:/, "", name)
                if (name in want) { lines += $5; miss += $6; got[name] = 1 } }
            END { if (lines) printf "%-18s %-22s %d of %d (%.2f%%) in %d functions\n", t, "parser functions", lines - miss, lines, 100 * (lines - miss) / lines, length(got) }'
done
