"""What the bench tools share: reading k25bench's result files (JSON lines, one object per
concurrency level) and other inputs, writing outputs, and ending on bad input or an output that
cannot be written with one line on stderr and exit status 2."""
import argparse
import csv
import io
import json
import lzma
import math
import os
import sys


def fail(msg):
    """Ends the tool: MSG on stderr, exit status 2."""
    print(msg, file=sys.stderr)
    sys.exit(2)


def open_text(path, who):
    """PATH's UTF-8 text as a file (decompressed when PATH ends in .xz: committed traces are)."""
    try:
        with (lzma.open if path.endswith(".xz") else open)(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(f"{who}: {path}: {e.strerror or e}")
    except (lzma.LZMAError, EOFError) as e:
        fail(f"{who}: {path}: not xz data ({e})")
    try:
        return io.StringIO(data.decode(), newline="")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        fail(f"{who}: {path}:{line}: not UTF-8 text")


def read_jsonl(path, who):
    """The objects of PATH in order; a line that is not one ends the tool naming it."""
    rows = []
    for n, line in enumerate(open_text(path, who), 1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{who}: {path}:{n}: not JSON: {e}")
        if not isinstance(row, dict):
            fail(f"{who}: {path}:{n}: not a JSON object")
        rows.append(row)
    return rows


def read_csv(path, who, columns):
    """(line number, {column: text}) of each row of the CSV file PATH, whose header must have
    COLUMNS, and every row as many fields as the header."""
    reader = csv.DictReader(open_text(path, who))
    if reader.fieldnames is None:
        fail(f"{who}: {path}: empty")
    missing = [c for c in columns if c not in reader.fieldnames]
    if missing:
        fail(f"{who}: {path}: its header lacks {', '.join(missing)}")
    for row in reader:
        if None in row or None in row.values():
            fail(f"{who}: {path}:{reader.line_num}: not the header's {len(reader.fieldnames)} "
                 "fields")
        yield reader.line_num, row


def number(text, kind, what):
    """TEXT as a KIND (int or float); a finite one, or the tool ends naming WHAT."""
    try:
        v = kind(text)
        if kind is int or math.isfinite(v):
            return v
    except ValueError:
        pass
    fail(f"{what} {text!r} is not {'an integer' if kind is int else 'a number'}")


def at_least(lo):
    """An argparse type: an integer, LO or more."""
    def parse(text):
        n = int(text)
        if n < lo:
            raise argparse.ArgumentTypeError(f"{text} is less than {lo}")
        return n
    parse.__name__ = "int"  # argparse's "invalid int value" names it
    return parse


def in_place(path):
    """Whether PATH is written where it is: it exists and is no regular file (/dev/null, a pipe,
    /dev/stdout, whose real path under /proc cannot be created anew)."""
    return os.path.exists(path) and not os.path.isfile(path)


def check_out(path, who):
    """Ends the tool unless PATH can be written; called before any work and any other output."""
    if os.path.isdir(path):
        fail(f"{who}: {path}: is a directory")
    if in_place(path):
        if not os.access(path, os.W_OK):
            fail(f"{who}: {path}: not writable")
        return
    d = os.path.dirname(path) or "."
    if not os.path.isdir(d):
        fail(f"{who}: {path}: no directory {d}")
    if not os.access(os.path.dirname(os.path.realpath(path)), os.W_OK):
        fail(f"{who}: {path}: its directory is not writable")


def write_out(path, data, who):
    """Writes DATA (str or bytes) to PATH whole: a file beside it renamed over it, so that a
    reader never sees half of it. A device or pipe (/dev/stdout) is written in place."""
    mode = "b" if isinstance(data, bytes) else ""
    try:
        if in_place(path):
            with open(path, "w" + mode) as f:
                f.write(data)
            return
        real = os.path.realpath(path)
        tmp = os.path.join(os.path.dirname(real), f".{os.path.basename(real)}.{os.getpid()}.tmp")
        try:
            with open(tmp, "x" + mode) as f:
                f.write(data)
            os.replace(tmp, real)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as e:
        fail(f"{who}: {path}: {e.strerror or e}")


def write_stdout(text, who):
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        # Python's own flush at exit would fail again, with a traceback: stdout goes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        fail(f"{who}: stdout: {e.strerror or e}")
