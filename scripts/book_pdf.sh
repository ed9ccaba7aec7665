#!/usr/bin/env bash
# The whole book as one PDF, offline (Linux): Jupyter Book's pdfhtml builder writes the book as one HTML page and
# prints it with Chromium through Playwright. Playwright looks for a browser of its own, a download; here the
# system's chromium stands in for it, linked where Playwright looks.
# Usage: scripts/book_pdf.sh JUPYTER_BOOK PYTHON   (make book-pdf)   ->  _build/pdf/book.pdf
set -euo pipefail
jupyter_book=$1
python=$2
chromium=$(command -v chromium || true)
if [ -z "$chromium" ]; then
    echo "book_pdf.sh: the PDF is printed by Debian's chromium, which is not installed (apt-get install -y chromium)" >&2
    exit 1
fi
# Playwright launches <browsers>/chromium_headless_shell-<revision>/chrome-headless-shell-linux64/chrome-headless-shell,
# the revision being the one its driver lists in browsers.json.
revision=$("$python" -c '
import json, pathlib, playwright
listed = json.loads((pathlib.Path(playwright.__file__).parent / "driver/package/browsers.json").read_text())
print(next(b["revision"] for b in listed["browsers"] if b["name"] == "chromium-headless-shell"))')
browsers=$PWD/_build/playwright-browsers
shell=$browsers/chromium_headless_shell-$revision/chrome-headless-shell-linux64
mkdir -p "$shell"
ln -sf "$chromium" "$shell/chrome-headless-shell"
PLAYWRIGHT_BROWSERS_PATH=$browsers "$jupyter_book" build . --builder pdfhtml
