#!/usr/bin/env python3
"""Finds, for each kernel of a CUDA object, a kernel with the same machine code in other objects.

A change that leaves a kernel's SASS as it was, or makes it the SASS of a kernel some earlier
build had, runs as that kernel ran: its time is the one measured for it. This prints one line per
kernel of NEW: "same" and the reference kernel with the same instructions (the reference object's
kernel of the same name first, then any other), or "new" when no reference kernel has them.

Instructions are compared with their operands, after the addresses and the scheduling words are
dropped. Unless --exact, the constant-bank offsets of bank 0 (the kernel's parameters, and the
launch values beside them) are ignored too: an argument struct that grows moves every parameter
after it, and nothing else.

  scripts/sass_same.py build/kernels/moe_w4a16.o /path/old/build/kernels/moe_w4a16.o
  scripts/sass_same.py NEW.o REF1.o REF2.o --require-all   # exit 1 unless every kernel is "same"
                                                           # (and NEW has one)
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_pdl_sass import demangle, find_cuobjdump, kernels_of  # noqa: E402

INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
PARAM = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")


def code_of(cuobjdump, obj, exact):
    """{mangled name: tuple of instructions} of every function in obj."""
    return {name: tuple(ins if exact else PARAM.sub("c[0x0][P]", ins) for ins in code)
            for name, code in kernels_of(cuobjdump, obj, INSTR).items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("new")
    ap.add_argument("refs", nargs="+")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--exact", action="store_true", help="compare parameter offsets too")
    ap.add_argument("--require-all", action="store_true",
                    help="exit 1 unless every kernel of NEW has a reference")
    args = ap.parse_args()
    cuobjdump = find_cuobjdump(args.cuobjdump)
    new = code_of(cuobjdump, args.new, args.exact)
    if args.require_all and not new:
        sys.exit(f"sass_same.py: {args.new}: no kernel in its SASS listing, so none to require")
    refs = [(r, code_of(cuobjdump, r, args.exact)) for r in args.refs]
    # demangled, without the parameter list (the template arguments tell instantiations apart)
    names = {n: re.sub(r"\(.*\)$", "", d)
             for n, d in demangle(sorted(set(new) | {n for _, k in refs for n in k})).items()}
    missing = 0
    for name in sorted(new, key=lambda n: names[n]):
        code = new[name]
        match = (next(((ref, name) for ref, k in refs if k.get(name) == code), None) or
                 next(((ref, n) for ref, k in refs for n, c in k.items() if c == code), None))
        if match:
            ref, rname = match
            other = "" if rname == name else f" as {names[rname]}"
            print(f"same  {names[name]}  ({len(code)} instructions) = {ref}{other}")
        else:
            missing += 1
            print(f"new   {names[name]}  ({len(code)} instructions)")
    print(f"{len(new) - missing} of {len(new)} kernels have a reference kernel's code")
    return 1 if args.require_all and missing else 0


if __name__ == "__main__":
    sys.exit(main())
