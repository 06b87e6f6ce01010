#!/usr/bin/env python3
"""Checks the SASS of the CUDA objects for the rules of programmatic dependent launch (PDL).

A kernel launched through k25_launch may run while the kernel before it in the stream still
runs; it must not touch memory that an earlier kernel writes or reads before k25_pdl_wait()
(griddepcontrol.wait, SASS ACQBULK). k25_pdl_trigger() is griddepcontrol.launch_dependents
(SASS PREEXIT). What the source says is not enough: ptxas moves ld.global.nc loads (a const
__restrict__ pointer, __ldg; SASS LDG.*.CONSTANT) across ACQBULK in both directions, so a read
of the previous kernel's output through such a pointer can end up before the wait when the wait
is not the kernel's first memory operation. Coherent loads and all stores stay on their side.

Rules, for every kernel in the objects:
  - a kernel with ACQBULK: before the first ACQBULK (listing order) no global store, atomic,
    reduction or async copy; no global load either, unless the kernel's name matches
    --prologue (its source loads weights, or step inputs uploaded before the step, before the
    wait on purpose: such a kernel must read the previous kernel's output with coherent loads,
    __ldcg or a plain load through a pointer without __restrict__, which is checked in the
    source, not here); async copies into shared memory (LDGSTS, or tensor-map copies: UTMALDG)
    only in a kernel that matches --async-prologue (the MLA attention fetches the cache rows
    older than the step before its wait, the warpgroup-MMA GEMM its weights' first stages);
  - a kernel without ACQBULK: an error unless its name matches --exempt (load-time kernels).
Prints one line per kernel and exits 1 on any violation, or when an object named on the command
line has no kernel (the default objects include host code's, which have none), or no object has.

  scripts/check_pdl_sass.py                       # $BUILD/kernels/*.o (BUILD=build)
  scripts/check_pdl_sass.py build-x/kernels/mla.o --cuobjdump /path/to/cuobjdump
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

DEFAULT_PROLOGUE = (r"mla_attn_mma_kernel|mla_out_kernel|mla_absorb_kernel|gemv_tile_kernel|"
                    r"router_topk_warp_kernel|rmsnorm_reg_kernel")
DEFAULT_EXEMPT = r"w4_repack_|synth_fill_kernel"
DEFAULT_ASYNC_PROLOGUE = r"mla_attn_mma_kernel|wg_gemm_kernel"

# Global or generic memory instructions (shared memory and constant-bank loads are not).
STORE_LIKE = re.compile(r"^(STG|ST|ATOMG|ATOM|RED|REDG|REDUX\.G|LDGSTS|UBLKCP|UTMALDG|UTMASTG)"
                        r"(\.|$)")
LOAD = re.compile(r"^(LDG|LD)(\.|$)")
INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")


def find_cuobjdump(given):
    cands = [given, os.environ.get("CUOBJDUMP"),
             os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"),
             shutil.which("cuobjdump")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit(f"{os.path.basename(sys.argv[0])}: cuobjdump not found (--cuobjdump, $CUOBJDUMP or "
             "$CUDA_HOME/bin)")


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.split("\n")
    return {n: (lines[i] if i < len(lines) and lines[i] else n) for i, n in enumerate(names)}


def kernels_of(cuobjdump, obj, instr=INSTR):
    """{mangled name: [instr's first group of each instruction line] in listing order} of every
    function in obj (the opcode by default)."""
    res = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {cuobjdump} -sass {obj} failed: "
                 f"{res.stderr.strip()}")
    funcs = {}
    cur = None
    for line in res.stdout.split("\n"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = instr.search(line)
        if m and cur is not None:
            cur.append(m.group(1))
    return funcs


def check(name, ops, prologue, exempt, async_prologue):
    """(ok, note) for one kernel."""
    waits, triggers = ops.count("ACQBULK"), ops.count("PREEXIT")
    if not waits:
        if exempt.search(name):
            return True, "no PDL (exempt)"
        return False, "no griddepcontrol.wait (ACQBULK)"
    first = ops.index("ACQBULK")
    before = ops[:first]
    copies = ([o for o in before if o.startswith(("LDGSTS", "UTMALDG"))]
              if async_prologue.search(name) else [])
    bad = sorted({o for o in before if STORE_LIKE.match(o) and o not in copies})
    loads = [o for o in before if LOAD.match(o)]
    note = f"wait x{waits}, trigger x{triggers}"
    if bad:
        return False, f"{note}; before the wait: {', '.join(bad)}"
    if loads and not prologue.search(name):
        return False, (f"{note}; before the wait: {', '.join(sorted(set(loads)))} "
                       "(no prologue kernel)")
    if loads:
        nc = sum("CONSTANT" in o for o in loads)
        note += f"; prologue: {len(loads)} loads before the wait ({nc} .nc)"
    if copies:
        note += f", {len(copies)} async copies"
    return True, note


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("objects", nargs="*")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--prologue", default=DEFAULT_PROLOGUE,
                    help="kernels allowed to load (weights) before the wait, regex")
    ap.add_argument("--async-prologue", default=DEFAULT_ASYNC_PROLOGUE,
                    help="kernels allowed to issue async copies (LDGSTS, UTMALDG) before the wait, "
                         "regex")
    ap.add_argument("--exempt", default=DEFAULT_EXEMPT,
                    help="kernels allowed to have no PDL (load time), regex")
    args = ap.parse_args()
    default = os.path.join(os.environ.get("BUILD", "build"), "kernels", "*.o")
    objs = args.objects or sorted(glob.glob(default))
    if not objs:
        sys.exit("check_pdl_sass: no object files (build with CUDA=1 first)")
    cuobjdump = find_cuobjdump(args.cuobjdump)
    prologue, exempt = re.compile(args.prologue), re.compile(args.exempt)
    async_prologue = re.compile(args.async_prologue)
    n_ok = n_bad = 0
    for obj in objs:
        funcs = kernels_of(cuobjdump, obj)
        if not funcs and args.objects:
            n_bad += 1
            print(f"FAIL {os.path.basename(obj):22s} {'':40s} no kernel in its SASS listing")
        pretty = demangle(list(funcs))
        for name, ops in sorted(funcs.items(), key=lambda kv: pretty[kv[0]]):
            ok, note = check(pretty[name], ops, prologue, exempt, async_prologue)
            n_ok += ok
            n_bad += not ok
            short = pretty[name].split("(")[0]
            print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(obj):22s} {short:40s} {note}")
    if not n_ok + n_bad:  # only the default objects can get here
        n_bad = 1
        print(f"FAIL no kernel in {default} ({len(objs)} objects)")
    print(f"{n_ok} passed, {n_bad} failed")
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
