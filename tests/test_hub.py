"""Models by name (formats/hub.py) without a network: a Hugging Face cache laid out as huggingface_hub
lays it out, and a hub on loopback (HF_ENDPOINT) serving a tiny repo."""

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from oxinfer.formats.hub import resolve
from oxinfer.testing import write_tiny_hf, write_tiny_llama

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_cache(cache: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT) -> None:
    """huggingface_hub's layout: blobs by hash, a snapshot of links to them, refs/main -> commit."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    snap = root / "snapshots" / commit
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(os.path.relpath(blob, (snap / name).parent))


def oxinfer(*args, **env):
    full = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **env}
    full.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "oxinfer.cli", *args], capture_output=True, text=True, timeout=120,
                          env=full)


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """The files of two tiny repos: an HF directory and a GGUF one."""
    tmp = tmp_path_factory.mktemp("repos")
    write_tiny_hf(tmp / "hf", seed=3, tied=True)
    hf = {p.name: p.read_bytes() for p in (tmp / "hf").iterdir()}
    gguf = {"tiny-Q4_1.gguf": write_tiny_llama(tmp / "tiny-Q4_1.gguf").read_bytes(), "README.md": b"tiny"}
    (tmp / "split").mkdir()
    write_tiny_llama(tmp / "split" / "tiny-Q4_1.gguf", split_max_tensors=12)  # the same model in 2 shards
    split = {p.name: p.read_bytes() for p in (tmp / "split").iterdir()}
    return tmp, hf, gguf, split


def test_a_cached_model_runs_by_name_offline(repos, tmp_path, monkeypatch):
    tmp, hf, gguf, split = repos
    cache = tmp_path / "hub"
    fill_cache(cache, "org/tiny", hf)
    fill_cache(cache, "org/tiny-GGUF", gguf)
    fill_cache(cache, "org/tiny-split-GGUF", {**split, "tiny-Q8_0.gguf": b"not read"})
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": "http://127.0.0.1:9"}
    local = oxinfer("run", "--model", str(tmp / "hf"), "--raw", "--max-tokens", "6", "hi")
    by_name = oxinfer("run", "--model", "org/tiny", "--raw", "--max-tokens", "6", "hi", **env)
    assert local.returncode == by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == local.stdout and "6 generated" in by_name.stderr
    whole = oxinfer("run", "--model", "org/tiny-GGUF:Q4_1", "--raw", "--max-tokens", "6", "hi", **env)
    assert whole.returncode == 0 and "6 generated" in whole.stderr, whole.stderr
    r = oxinfer("run", "--model", "org/tiny-split-GGUF:Q4_1", "--raw", "--max-tokens", "6", "hi", **env)
    assert r.returncode == 0 and r.stdout == whole.stdout and "6 generated" in r.stderr, r.stderr  # every shard
    for k, v in env.items():  # the other spellings of a name: the same files (resolved here: a run each took ~2 s)
        monkeypatch.setenv(k, v)
    want = resolve("org/tiny-GGUF:Q4_1")
    assert want.name == "tiny-Q4_1.gguf" and want.read_bytes() == gguf["tiny-Q4_1.gguf"]
    for name in ("org/tiny-GGUF:q4_1", "org/tiny-GGUF/tiny-Q4_1.gguf", "org/tiny-GGUF@main:Q4_1"):
        assert resolve(name) == want, name
    first = resolve("org/tiny-split-GGUF:Q4_1")
    assert first.name == "tiny-Q4_1-00001-of-00002.gguf" and first.with_name("tiny-Q4_1-00002-of-00002.gguf").exists()
    assert resolve("org/tiny-split-GGUF/tiny-Q4_1-00002-of-00002.gguf") == first
    r = oxinfer("run", "--model", "org/tiny-GGUF:Q8_0", "--raw", "hi", **env)
    assert r.returncode == 2 and "org/tiny-GGUF:Q8_0: no GGUF files match (the repository's: tiny-Q4_1.gguf)" in r.stderr


def test_offline_and_not_cached_is_a_clear_error(tmp_path):
    r = oxinfer("run", "--model", "org/absent", "hi", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "org/absent is not in the Hugging Face cache" in r.stderr and "HF_HUB_OFFLINE" in r.stderr
    for path in ("not/a/hub/name.bin", "models/typo.gguf"):  # paths, never sent to the hub
        r = oxinfer("run", "--model", path, "hi", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
        assert r.returncode == 2 and "no such model file" in r.stderr, r.stderr


class _Hub(BaseHTTPRequestHandler):
    """The hub's routes huggingface_hub calls for these repos: the file tree and revision info,
    and each file under resolve/ (HEAD for its commit, etag and size, GET for its bytes)."""

    repos: dict[str, dict[str, bytes]] = {}
    requests: list[str] = []

    def log_message(self, *args):
        pass

    def _file(self):
        # /{org}/{name}/resolve/{rev}/{path}
        parts = self.path.split("?")[0].strip("/").split("/")
        repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        return self.repos.get(repo, {}).get(name) if parts[2:3] == ["resolve"] and rev in ("main", COMMIT) else None

    def _send(self, code, body=b"", headers=None, head=False):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _file_headers(self, data):
        return {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                "Content-Type": "application/octet-stream"}

    def do_HEAD(self):  # noqa: N802
        self.requests.append("HEAD " + self.path)
        data = self._file()
        if data is None:
            return self._send(404, head=True, headers={"X-Error-Code": "EntryNotFound"})
        self.send_response(200)
        for k, v in self._file_headers(data).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()

    def do_GET(self):  # noqa: N802
        self.requests.append("GET " + self.path)
        path = self.path.split("?")[0]
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/"):].split("/")
            repo, files = "/".join(rest[:2]), self.repos.get("/".join(rest[:2]))
            if files is None:
                return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
            if rest[2:3] == ["tree"]:
                body = [{"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                        for n, d in files.items()]
            else:  # the repo, or one revision of it
                body = {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": n} for n in files]}
            return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
        data = self._file()
        if data is None:
            return self._send(404, b"not found", {"X-Error-Code": "EntryNotFound"})
        return self._send(200, data, self._file_headers(data))


def test_a_model_by_name_downloads_from_the_hub_into_the_cache(repos, tmp_path):
    tmp, hf, gguf, split = repos
    _Hub.repos = {"org/tiny": hf, "org/tiny-GGUF": gguf, "org/tiny-split-GGUF": split}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}", "HF_HUB_CACHE": str(tmp_path / "hub"),
               "HF_HUB_OFFLINE": "0"}
        for name in ("org/tiny", "org/tiny-GGUF:Q4_1", "org/tiny-split-GGUF:Q4_1"):
            r = oxinfer("run", "--model", name, "--raw", "--max-tokens", "3", "hi", **env)
            assert r.returncode == 0 and "3 generated" in r.stderr, (name, r.stderr[-2000:])
            if name == "org/tiny":  # huggingface_hub's progress bar, drawn on stderr while it downloads
                assert f"Fetching {len(hf)} files: 100%|" in r.stderr, r.stderr[-2000:]
        cached = tmp_path / "hub" / "models--org--tiny" / "snapshots" / COMMIT / "config.json"
        assert cached.read_bytes() == hf["config.json"]
        # now cached: offline, the same names still run, with no request to the hub
        _Hub.requests.clear()
        r = oxinfer("run", "--model", "org/tiny", "--raw", "--max-tokens", "3", "hi", **{**env, "HF_HUB_OFFLINE": "1"})
        assert r.returncode == 0 and not _Hub.requests, _Hub.requests
        r = oxinfer("run", "--model", "org/nope", "hi", **env)
        assert r.returncode == 2 and "org/nope: no such repository" in r.stderr
    finally:
        server.shutdown()
