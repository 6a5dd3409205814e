"""`pretrained=True` downloads: every released tag, served from a loopback HTTP server (no test touches the internet).

The server (`http.server` on 127.0.0.1, port 0, a thread) answers at the path and query of each tag's real URL
(TsinghuaCloud `/f/<key>/?dl=1`, Dropbox `/s/<key>/model_best.pth?dl=1`, GitHub
`/<owner>/<repo>/releases/download/<tag>/<file>`), and, as those hosts do, redirects to the file. The file is a
small state dict in the official key layout (tests/_fixtures, values expanded from one number per key) in the official
container of its family. The tag's registered cfg is pointed at the server, then the user's call
`timm.create_model(tag, pretrained=True)` must download it into a cache file named after the tag and load it strictly
(full-size models are built on the meta device: names and shapes are checked).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import timm
import torch
from timm.models import _registry

import subquad
from subquad.models import _builder
from subquad.models._builder import pretrained_cache_path

from .test_pretrained import _official_keys
from .test_remap import random_state_dict

RELEASED = sorted(t for t in timm.list_pretrained() if subquad.models.is_subquad_model(t))
HOSTS = {"cloud.tsinghua.edu.cn": "tsinghua", "www.dropbox.com": "dropbox", "github.com": "github"}

# Loading into a meta model is a no-op per tensor, and torch says so for each one.
pytestmark = pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter:UserWarning")


def _host(tag: str) -> str:
    return HOSTS[urlsplit(timm.models.get_pretrained_cfg(tag).url).netloc]


def official_file(tag: str) -> tuple[bytes, dict[str, torch.Tensor]]:
    """torch.save bytes of a checkpoint of `tag` in its family's official container, and the tensors in it (values
    differ per tag, so a file loaded for the wrong tag is told apart)."""
    name = tag.split(".")[0]
    seed = int(hashlib.sha256(tag.encode()).hexdigest()[:6], 16)
    sd = random_state_dict(_official_keys(name), seed=seed)
    if name.startswith("l2vit"):  # ConvNeXt-style utils.save_model (without its argparse `args`)
        obj = {"model": sd, "model_ema": sd, "epoch": 299}
    elif name.startswith("vil_ls"):  # transformer-ls Checkpointer.save: DDP `module.` keys under `net`
        obj = {"net": {f"module.{k}": v for k, v in sd.items()}, "arch": "msvit", "epoch": 299, "best_acc": 83.8}
    else:  # FLatten (Swin-style save_checkpoint, without its yacs `config`)
        obj = {"model": sd, "max_accuracy": 82.1, "epoch": 299}
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue(), sd


class Server:
    """Loopback HTTP server: `files[path?query] = bytes`; a request for it is redirected to `/blob/<n>` (as the real
    hosts redirect to their storage), which sends the bytes. `hits` lists the requested paths."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.raw: dict[str, tuple[int, dict[str, str], bytes]] = {}  # path -> (status, headers, body) sent as is
        self.hits: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server.hits.append(self.path)
                if self.path in server.raw:
                    status, headers, body = server.raw[self.path]
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body)
                    return
                paths = list(server.files)
                if self.path in server.files:
                    self.send_response(302)
                    self.send_header("Location", f"/blob/{paths.index(self.path)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path.startswith("/blob/") and int(self.path[6:]) < len(paths):
                    body = server.files[paths[int(self.path[6:])]]
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url_for(self, real_url: str) -> str:
        """The loopback URL with the real URL's path and query."""
        u = urlsplit(real_url)
        return self.base + u.path + (f"?{u.query}" if u.query else "")


@pytest.fixture(scope="module")
def server():
    s = Server()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """A fresh torch hub dir through TORCH_HOME (what users set), so nothing from ~/.cache is used."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    assert torch.hub.get_dir() == str(tmp_path / "torch" / "hub")
    return tmp_path / "torch" / "hub" / "checkpoints" / "subquad"


def point_at(monkeypatch, tag: str, url: str) -> None:
    """Point the registered cfg of `tag` at `url` (what a user's `timm.create_model(tag, pretrained=True)` reads)."""
    cfgs = _registry._model_pretrained_cfgs
    monkeypatch.setitem(cfgs, tag, dataclasses.replace(cfgs[tag], url=url))


def serve(server: Server, monkeypatch, tag: str) -> tuple[str, bytes, dict[str, torch.Tensor]]:
    real = timm.models.get_pretrained_cfg(tag).url
    url = server.url_for(real)
    assert urlsplit(url).path == urlsplit(real).path and urlsplit(url).query == urlsplit(real).query
    data, sd = official_file(tag)
    server.files[urlsplit(url).path + (f"?{urlsplit(url).query}" if urlsplit(url).query else "")] = data
    point_at(monkeypatch, tag, url)
    return url, data, sd


@pytest.fixture
def loaded(monkeypatch):
    """Records what each build hands to the strict load (the model is on meta, so its values cannot be read back)."""
    seen: list[dict[str, torch.Tensor]] = []
    original = _builder.load_into

    def spy(model, sd, strict=True, what="checkpoint"):
        seen.append(sd)
        return original(model, sd, strict=strict, what=what)

    monkeypatch.setattr(_builder, "load_into", spy)
    return seen


def test_released_tags_cover_every_host():
    assert len(RELEASED) >= 15
    assert {_host(t) for t in RELEASED} == set(HOSTS.values())


def test_cache_names_are_unique_per_tag(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    paths = {}
    for tag in RELEASED:
        name, t = tag.split(".")
        path = pretrained_cache_path(timm.models.get_pretrained_cfg(tag).url, name, t)
        assert path.parent == tmp_path / "hub" / "checkpoints" / "subquad"
        assert path.name.startswith(f"{tag}-") and path.suffix == ".pth", path
        paths[tag] = path
    assert len(set(paths.values())) == len(RELEASED), paths


def _download_and_load(server, monkeypatch, hub, loaded, caplog, tag):
    url, data, sd = serve(server, monkeypatch, tag)
    name, t = tag.split(".")
    before = len(server.hits)
    with caplog.at_level(logging.INFO, logger=_builder.__name__):
        m = timm.create_model(tag, pretrained=True, device="meta")
    assert m.pretrained_cfg["tag"] == t
    path = pretrained_cache_path(url, name, t)
    assert path.parent == hub and path.name.startswith(f"{tag}-")
    assert path.read_bytes() == data
    assert [p.name for p in hub.iterdir() if p.name.startswith(f"{tag}-")] == [path.name]  # no temp file left
    assert len(server.hits) == before + 2  # the URL, then the file it redirects to
    lines = [r.getMessage() for r in caplog.records if r.name == _builder.__name__]
    assert len(lines) == 1 and url in lines[0] and str(path) in lines[0] and "MB" in lines[0], lines
    # Loaded strictly (load_into raises on any missing/unexpected key or shape), with this tag's values.
    own = m.state_dict()
    got = loaded[-1]
    assert set(got) == set(own)
    for k in list(own)[:: max(1, len(own) // 20)]:
        if k in sd:
            assert torch.equal(got[k], sd[k]), (tag, k)
    return url, path


@pytest.mark.parametrize("tag", RELEASED)
def test_release_downloads_to_own_file_and_loads(server, monkeypatch, hub, loaded, caplog, tag):
    url, path = _download_and_load(server, monkeypatch, hub, loaded, caplog, tag)
    # The cached file is used again without the network.
    hits = len(server.hits)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=_builder.__name__):
        timm.create_model(tag, pretrained=True, device="meta")
    assert len(server.hits) == hits
    lines = [r.getMessage() for r in caplog.records if r.name == _builder.__name__]
    assert len(lines) == 1 and "cached" in lines[0] and str(path) in lines[0], lines


@pytest.mark.parametrize("first,second", [("vil_ls_medium.in1k", "vil_ls_medium_384.in1k"),
                                          ("l2vit_base.in1k", "l2vit_base.in22k_ft_in1k")])
def test_second_tag_of_a_family_gets_its_own_file(server, monkeypatch, hub, loaded, caplog, first, second):
    """Two ViL-LS tags share the file name `model_best.pth` in their URLs, two L2ViT-Base tags share one
    architecture: after the first is cached, asking for the second downloads and loads the second."""
    _, p1 = _download_and_load(server, monkeypatch, hub, loaded, caplog, first)
    caplog.clear()
    _, p2 = _download_and_load(server, monkeypatch, hub, loaded, caplog, second)
    assert p1 != p2 and p1.is_file() and p2.is_file()


def _closed_port_url(real: str = "https://cloud.tsinghua.edu.cn/f/0123456789abcdef0123/?dl=1") -> str:
    """`real`'s path and query on a loopback port that nothing listens on (connection refused, as offline)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    u = urlsplit(real)
    return f"http://127.0.0.1:{port}{u.path}" + (f"?{u.query}" if u.query else "")


@pytest.mark.parametrize("tag", ["flatten_swin_tiny.in1k", "l2vit_tiny.in1k", "vil_ls_base.in1k"])
def test_offline_one_line_error(monkeypatch, hub, tag):
    url = _closed_port_url(timm.models.get_pretrained_cfg(tag).url)
    point_at(monkeypatch, tag, url)
    with pytest.raises(subquad.errors.UserError) as e:
        timm.create_model(tag, pretrained=True, device="meta")
    msg = str(e.value)
    assert "\n" not in msg and url in msg and "pretrained_cfg_overlay=dict(file=PATH)" in msg, msg
    assert "--checkpoint PATH" in msg
    assert not hub.exists() or not list(hub.iterdir())


def test_offline_cli_exit_2(monkeypatch, hub, capsys):
    from subquad_cli.__main__ import main

    url = _closed_port_url()
    point_at(monkeypatch, "flatten_pvt_v2_b0.in1k", url)
    rc = main(["train", "--model", "flatten_pvt_v2_b0.in1k", "--model-kwargs", '{"pretrained": true}', "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("subquad train: error: cannot download") and url in err[0], err


@pytest.mark.parametrize("case", ["html", "truncated", "short_body", "http_404"])
def test_bad_download_is_not_kept(server, monkeypatch, hub, case):
    tag = "flatten_pvt_v2_b0.in1k"
    url = server.url_for(timm.models.get_pretrained_cfg(tag).url) + f"&case={case}"
    path = urlsplit(url).path + "?" + urlsplit(url).query
    data, _ = official_file(tag)
    octet = {"Content-Type": "application/octet-stream"}
    server.raw[path] = {
        "html": (200, {"Content-Type": "text/html"}, b"<!DOCTYPE html><html>login</html>"),
        # a file cut short by the host (its length says so): torch cannot read it
        "truncated": (200, {**octet, "Content-Length": str(len(data) // 2)}, data[: len(data) // 2]),
        # a connection that closes before Content-Length bytes
        "short_body": (200, {**octet, "Content-Length": str(len(data))}, data[: len(data) // 2]),
        "http_404": (404, {"Content-Length": "0"}, b""),
    }[case]
    point_at(monkeypatch, tag, url)
    with pytest.raises(subquad.errors.UserError) as e:
        timm.create_model(tag, pretrained=True, device="meta")
    msg = str(e.value)
    assert "\n" not in msg and url in msg and "nothing was cached" in msg, msg
    expected = {"html": ("HTML page",), "truncated": ("not a readable checkpoint",),
                "short_body": ("broke off", "incomplete"), "http_404": ("HTTP 404",)}[case]
    assert any(x in msg for x in expected), msg
    assert not list(hub.iterdir())  # neither the file nor its temporary


def test_damaged_cache_file_says_delete_it(monkeypatch, hub):
    tag = "flatten_pvt_v2_b0.in1k"
    url = "http://127.0.0.1:9/f/5d1f01532b104da28e7b/?dl=1"
    point_at(monkeypatch, tag, url)
    path = pretrained_cache_path(url, "flatten_pvt_v2_b0", "in1k")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(subquad.errors.UserError, match="delete that cached file") as e:
        timm.create_model(tag, pretrained=True, device="meta")
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_truncated_local_file_one_line(tmp_path):
    """A torch zip cut short (torch.load raises OSError errno 22 for some cuts) is a one-line error naming it."""
    data, _ = official_file("flatten_pvt_v2_b0.in1k")
    path = tmp_path / "cut.pth"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(subquad.errors.UserError, match="is not a readable checkpoint") as e:
        subquad.create_model("flatten_pvt_v2_b0", checkpoint_path=str(path), device="meta")
    assert "\n" not in str(e.value) and str(path) in str(e.value)
