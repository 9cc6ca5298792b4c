"""What redaction finds and what it costs (memrl_mcp/redaction.py): every text a write stores passes it.

- **recall**: of the corpus of tests/support/secrets.py (secrets of many formats, each in its context), how many are
  gone from the redacted text (whole, and no 12 characters of their head, middle or tail left); and of the texts
  that look like secrets and are none, how many come through unchanged;
- **cost**: ``redacted`` on texts a write carries: a prompt of 300 characters, an experience of 2 KB, a pasted
  5 KB of shell session with a few secrets in it, the largest experience accepted (20 KB); median of the runs;
- **import**: ``import redact_secret`` in a fresh process, once per server start (never in a hook).

    /work/main/.venv/bin/python perf/redaction.py            # 5 runs of 200 calls of each
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

sys.path.insert(0, str(B.REPO))
from memrl_mcp.redaction import redacted
from tests.support.secrets import NOT_SECRETS, leaks

SESSION = "$ pytest -q tests/unit\n........ 8 passed in 0.42s\n$ git log --oneline -3\n4f1c2e9 fix the parser\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    corpus = leaks()
    gone = 0
    for leak in corpus:
        out, secret, middle = redacted(leak.text), leak.secret, max(0, len(leak.secret) // 2 - 6)
        windows = [secret] if len(secret) < 12 else [secret[:12], secret[middle : middle + 12], secret[-12:]]
        gone += not any(window in out for window in windows)
    kept = sum(redacted(text) == text for text in NOT_SECRETS)
    print(f"recall: {gone}/{len(corpus)} secrets redacted; {kept}/{len(NOT_SECRETS)} look-alikes kept unchanged")
    pasted = (SESSION * 40)[:4000] + "\n".join(leak.text for leak in corpus[:4])
    texts = {
        "prompt, 300 chars": ("deploy the billing service to staging and check the health page " * 5)[:300],
        "experience, 2 KB": ("1. run make migrate. 2. run make deploy ENV=staging. 3. check /health. " * 30)[:2000],
        f"pasted session, {len(pasted) // 1000} KB, 4 secrets": pasted,
        "experience, 20 KB (the limit)": (SESSION * 200)[:20000],
    }
    rows = []
    for name, text in texts.items():
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            for _ in range(args.calls):
                redacted(text)
            times.append((time.perf_counter() - started) / args.calls * 1000)
        rows.append((name, B.p50(times), min(times), max(times)))
    print(B.table(("text", "median ms a call", "min ms", "max ms"), rows))
    imports = []
    for _ in range(args.runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import redact_secret; redact_secret.scan('x')"], check=True)
        imports.append(time.perf_counter() - started)
    floor = []
    for _ in range(args.runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        floor.append(time.perf_counter() - started)
    print(f"python -c 'import redact_secret; scan': {B.p50(imports) * 1000:.0f} ms; python -c pass: "
          f"{B.p50(floor) * 1000:.0f} ms (median of {args.runs})")  # fmt: skip


if __name__ == "__main__":
    main()
