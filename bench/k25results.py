"""Reading k25bench's result files: JSON lines, one object per concurrency level."""
import json


def read_jsonl(path, who):
    """The objects of PATH in order; exits with "WHO: PATH:LINE: not JSON" on a bad line."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{who}: {path}:{n}: not JSON: {e}") from None
    return rows
