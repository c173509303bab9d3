"""Smoke tests of dlslime-bench through `python -m dlslime.bench`.

They check that the benchmark runs, that it really verifies the bytes it moved, and that its
JSON report is well formed. Nothing here asserts a time.
"""

import json
import os
import re
import subprocess
import sys

import pytest

TINY = ["--sizes", "8..64", "--batch", "4", "--iters", "3", "--warmup", "1", "--progress", "none"]
ROW_KEYS = {"msg_size", "batch", "total_mb", "max_bw_gbps", "avg_bw_gbps", "min_lat_us", "avg_lat_us", "p99_lat_us"}


def run_bench(*args, timeout=120, env=None):
    return subprocess.run(
        [sys.executable, "-m", "dlslime.bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def load_report(path):
    with open(path) as f:
        doc = json.load(f)
    assert set(doc) == {"config", "rows"}
    return doc


@pytest.mark.parametrize("op", ["write", "read", "send"])
def test_bench_runs_verifies_and_writes_json(tmp_path, op):
    out = tmp_path / f"{op}.json"
    r = run_bench("--op", op, *TINY, "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify: all bytes of the last batch of every size matched" in r.stdout
    for header in ("MsgSize (B)", "BatchSize", "TotalSize (MB)", "Max BW (GB/s)", "Avg BW (GB/s)", "Min Lat (us)",
                   "Avg Lat (us)", "P99 Lat (us)"):
        assert header in r.stdout

    doc = load_report(out)
    config = doc["config"]
    assert config["op"] == op
    assert config["transport"] == "tcp"
    assert config["batch"] == 4
    assert config["verify"] is True and config["verified"] is True
    assert config["cpu"]["initiator_s"] > 0 and config["cpu"]["target_s"] > 0
    rows = doc["rows"]
    assert [row["msg_size"] for row in rows] == [8, 16, 32, 64]
    for row in rows:
        assert ROW_KEYS <= set(row)
        assert row["batch"] == 4
        assert row["iters"] == 3
        assert row["verified"] is True
        assert row["total_mb"] == pytest.approx(row["msg_size"] * 4 / 1e6)
        assert 0 < row["min_lat_us"] <= row["avg_lat_us"] and row["min_lat_us"] <= row["p99_lat_us"]
        assert row["max_bw_gbps"] >= row["avg_bw_gbps"] > 0
        assert row["msgs_per_s"] > 0
        if op == "send":
            assert row["recv_msgs_per_s"] > 0


def test_bench_contiguous_layout_and_odd_sizes(tmp_path):
    out = tmp_path / "contig.json"
    r = run_bench("--op", "write", "--contiguous", "--sizes", "1,3,4097", "--batch", "5", "--iters", "2",
                  "--warmup", "0", "--progress", "none", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = load_report(out)
    assert doc["config"]["layout"] == "contiguous"
    assert [row["msg_size"] for row in doc["rows"]] == [1, 3, 4097]


def test_bench_one_slot_layout_runs_unverified_and_refuses_send(tmp_path):
    out = tmp_path / "one.json"
    r = run_bench("--op", "read", "--one-slot", *TINY, "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = load_report(out)
    assert doc["config"]["layout"] == "one-slot"
    assert doc["config"]["verify"] is False and doc["config"]["verified"] is False
    assert all(row["avg_bw_gbps"] > 0 for row in doc["rows"])
    r = run_bench("--op", "send", "--one-slot", *TINY)
    assert r.returncode == 2 and "--one-slot applies to --op write and read" in r.stderr


@pytest.mark.parametrize("op", ["write", "read", "send"])
def test_bench_detects_corrupted_bytes(tmp_path, op):
    # --inject-corruption flips one received byte before the check: the run must fail.
    out = tmp_path / "bad.json"
    r = run_bench("--op", op, *TINY, "--inject-corruption", "--json", str(out))
    assert r.returncode != 0
    assert "VERIFY FAILED" in r.stderr
    doc = load_report(out)
    assert doc["config"]["verified"] is False
    assert all(row["verified"] is False for row in doc["rows"])


def test_bench_two_roles_over_a_bootstrap_port(tmp_path):
    target = subprocess.Popen(
        [sys.executable, "-m", "dlslime.bench", "--role", "target", "--listen", "127.0.0.1:0", "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = target.stderr.readline()
        m = re.search(r"waiting for an initiator on (127\.0\.0\.1:\d+)", line)
        assert m, line
        out = tmp_path / "two.json"
        r = run_bench("--role", "initiator", "--peer", m.group(1), "--op", "read", *TINY, "--json", str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        assert load_report(out)["config"]["mode"] == "two-host"
        assert target.wait(timeout=60) == 0
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


def test_bench_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot draws with matplotlib")
    png = tmp_path / "bench.png"
    r = run_bench("--op", "write", *TINY, "--plot", str(png))
    assert r.returncode == 0, r.stdout + r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_usage_errors_exit_2():
    r = run_bench("--op", "scatter")
    assert r.returncode == 2
    assert "--op must be read, write or send" in r.stderr
    r = run_bench("--sizes", "64..8")
    assert r.returncode == 2


def test_bench_reports_a_missing_binary(tmp_path):
    env = dict(os.environ, DLSLIME_BENCH_BIN=str(tmp_path / "no-such-binary"))
    r = run_bench("--help", env=env)
    assert r.returncode == 127
    assert "DLSLIME_BENCH_BIN" in r.stderr


def test_bench_reaches_transports_through_the_registry(tmp_path):
    import dlslime

    listed = run_bench("--list-transports")
    assert listed.returncode == 0, listed.stderr
    for t in dlslime.available_transports():
        line = next(l for l in listed.stdout.splitlines() if l.split()[0] == t["name"])
        assert ("available" in line) if t["available"] else (t["reason"] in line)

    unknown = run_bench("--transport", "carrier-pigeon", *TINY)
    assert unknown.returncode == 2 and "unknown transport" in unknown.stderr and "tcp" in unknown.stderr
    for t in dlslime.available_transports():
        if not t["available"]:
            r = run_bench("--transport", t["name"], *TINY)
            assert r.returncode == 2 and t["reason"] in r.stderr, r.stderr

    # The transport's own options go to its factory: used, reported, and checked strictly.
    out = tmp_path / "opts.json"
    r = run_bench("--op", "write", *TINY, "--transport-options", '{"lanes": 3}', "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    config = load_report(out)["config"]
    assert config["lanes"] == 3 and config["transport_options"] == {"lanes": 3}
    assert config["endpoint"]["transport"] == "tcp" and "mr_info" not in config["endpoint"]
    bad = run_bench("--op", "write", *TINY, "--transport-options", '{"no_such_option": 1}')
    assert bad.returncode != 0 and "unknown TcpEndpoint option 'no_such_option'" in bad.stderr
    assert run_bench("--transport-options", "[1]", *TINY).returncode == 2


def _rdma_built():
    import dlslime

    return hasattr(dlslime, "RDMAEndpoint")


@pytest.mark.skipif(not _rdma_built(), reason="RDMA transport not built (configure with -DBUILD_RDMA=ON)")
@pytest.mark.parametrize("op", ["write", "read", "send"])
def test_bench_rdma_on_the_simulated_device_prints_the_same_table(tmp_path, op):
    # Two processes, each with its own simulated sim_rdma0 (DLSLIME_RDMA_SIM=1).
    out = tmp_path / f"rdma-{op}.json"
    env = dict(os.environ, DLSLIME_RDMA_SIM="1")
    r = run_bench("--transport", "rdma", "--op", op, *TINY, "--json", str(out), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"DLSlime RDMA Benchmark: {op}" in r.stdout
    for header in ("MsgSize (B)", "BatchSize", "TotalSize (MB)", "Max BW (GB/s)", "Avg BW (GB/s)", "Min Lat (us)",
                   "Avg Lat (us)", "P99 Lat (us)"):
        assert header in r.stdout
    assert "verify: all bytes of the last batch of every size matched" in r.stdout
    # The figures are the code's on a software device, and the output says so.
    assert "these figures measure the code, not RDMA hardware" in r.stdout
    config = load_report(out)["config"]
    assert config["transport"] == "rdma" and config["simulated_device"] is True and config["verified"] is True
    assert config["endpoint"]["device"] == "sim_rdma0" and config["rdma_options"]["op_timeout_ms"] > 0
    rows = load_report(out)["rows"]
    assert [row["msg_size"] for row in rows] == [8, 16, 32, 64]
    assert all(row["verified"] and row["avg_bw_gbps"] > 0 for row in rows)
    # TCP's options are refused by name.
    bad = run_bench("--transport", "rdma", "--lanes", "2", *TINY, env=env)
    assert bad.returncode == 2 and "--lanes and --chunk-size are TCP's" in bad.stderr


# --- GPU memory (--device-memory, --transport nvlink) on the simulated GPU ------------------
# The simulated GPU's device memory faults on any host access (docs/nvlink.md), so these runs
# also prove that the bench and the transports fill, move and check it without touching it.

SIM_GPU_NOTE = "simulated GPU (DLSLIME_GPU_SIM=1): its device memory is host memory copied in software"
# Sizes around TCP's smallest chunk_size (4 KiB), so items are staged in several pipelined chunks.
GPU_SIZES = ["--sizes", "1,4097,20000", "--batch", "3", "--iters", "3", "--warmup", "1", "--progress", "none"]


def sim_gpu_env():
    return dict(os.environ, DLSLIME_GPU_SIM="1")


def no_gpu_env():
    # No simulated GPU, and no CUDA device visible even on a host that has one: every GPU
    # feature must refuse with the runtime's reason.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("DLSLIME_GPU_SIM", None)
    return env


def assert_gpu_run(r, out, title, memory):
    assert r.returncode == 0, r.stdout + r.stderr
    assert title in r.stdout, r.stdout
    assert "verify: all bytes of the last batch of every size matched" in r.stdout
    assert SIM_GPU_NOTE in r.stdout and "these figures measure the code, not a GPU" in r.stdout
    doc = load_report(out)
    config = doc["config"]
    assert config["simulated_gpu"] is True and config["verified"] is True
    for side in ("initiator", "target"):
        if memory[side] == "gpu":
            assert config["memory"][side] == {"memory": "gpu", "runtime": "sim", "device": 0}
        else:
            assert config["memory"][side] == {"memory": "host"}
    assert [row["msg_size"] for row in doc["rows"]] == [1, 4097, 20000]
    for row in doc["rows"]:
        assert row["verified"] is True and row["batch"] == 3 and row["iters"] == 3
        assert 0 < row["min_lat_us"] <= row["avg_lat_us"] and row["max_bw_gbps"] >= row["avg_bw_gbps"] > 0
    return config


# GPU-to-GPU both ways, GPU-to-host (write from the initiator's GPU) and host-to-GPU (read into it).
@pytest.mark.parametrize("op,side", [("write", "both"), ("read", "both"), ("write", "initiator"),
                                     ("read", "initiator"), ("write", "target")])
def test_bench_tcp_device_memory_on_the_simulated_gpu(tmp_path, op, side):
    out = tmp_path / f"gpu-{op}-{side}.json"
    r = run_bench("--op", op, "--device-memory", side, "--chunk-size", "4K", *GPU_SIZES, "--json", str(out),
                  env=sim_gpu_env())
    memory = {s: "gpu" if side in (s, "both") else "host" for s in ("initiator", "target")}
    where = "GPU memory both sides" if side == "both" else f"GPU memory on the {side}"
    config = assert_gpu_run(r, out, f"DLSlime TCP Benchmark: {op} (lanes 2, strided, {where}, simulated GPU)", memory)
    assert config["transport"] == "tcp" and config["device_memory"] == side
    assert config["tcp_options"]["chunk_size"] == 4096


def test_bench_device_memory_defaults_to_both_and_catches_corruption(tmp_path):
    # A bare --device-memory (followed by another option) means both sides.
    out = tmp_path / "both.json"
    r = run_bench("--device-memory", "--op", "write", *GPU_SIZES, "--json", str(out), env=sim_gpu_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert load_report(out)["config"]["device_memory"] == "both"
    # The check reads the GPU bytes back: a flipped byte there fails the run (target and initiator side).
    for op in ("write", "read"):
        bad = run_bench("--device-memory", "--op", op, *GPU_SIZES, "--inject-corruption", env=sim_gpu_env())
        assert bad.returncode == 1 and "VERIFY FAILED" in bad.stderr, bad.stdout + bad.stderr


def test_bench_device_memory_sends_messages_checked_byte_exact_and_refuses_bad_sides(tmp_path):
    out = tmp_path / "send.json"
    for side in ("both", "initiator", "target"):
        r = run_bench(f"--device-memory={side}", "--op", "send", *GPU_SIZES, "--json", str(out), env=sim_gpu_env())
        assert r.returncode == 0, r.stdout + r.stderr
        assert "all bytes of the last batch of every size matched" in r.stdout, r.stdout
        assert load_report(out)["config"]["device_memory"] == side
    bad = run_bench("--device-memory", "--op", "send", *GPU_SIZES, "--inject-corruption", env=sim_gpu_env())
    assert bad.returncode == 1 and "VERIFY FAILED" in bad.stderr, bad.stdout + bad.stderr
    r = run_bench("--device-memory=nowhere", *TINY, env=sim_gpu_env())
    assert r.returncode == 2 and "--device-memory must be initiator, target or both" in r.stderr


def _nvlink_built():
    import dlslime

    return hasattr(dlslime, "NVLinkEndpoint")


@pytest.mark.skipif(not _nvlink_built(), reason="NVLink transport not built (configure with -DBUILD_NVLINK=ON)")
@pytest.mark.parametrize("op", ["write", "read"])
def test_bench_nvlink_on_the_simulated_gpu(tmp_path, op):
    # Target and initiator are two processes (a process cannot open its own IPC handles).
    out = tmp_path / f"nvlink-{op}.json"
    r = run_bench("--transport", "nvlink", "--op", op, *GPU_SIZES, "--json", str(out), env=sim_gpu_env())
    config = assert_gpu_run(r, out, f"DLSlime NVLink Benchmark: {op} (strided, simulated GPU)",
                            {"initiator": "gpu", "target": "gpu"})
    assert config["transport"] == "nvlink" and config["device_memory"] == "both"
    assert config["endpoint"]["transport"] == "nvlink" and config["nvlink_options"]["device"] == 0
    assert config["lanes"] is None and config["chunk_size"] is None
    bad = run_bench("--transport", "nvlink", "--op", op, *GPU_SIZES, "--inject-corruption", env=sim_gpu_env())
    assert bad.returncode == 1 and "VERIFY FAILED" in bad.stderr, bad.stdout + bad.stderr


@pytest.mark.skipif(not _nvlink_built(), reason="NVLink transport not built (configure with -DBUILD_NVLINK=ON)")
def test_bench_nvlink_refuses_what_it_cannot_do():
    r = run_bench("--transport", "nvlink", "--op", "send", *TINY, env=sim_gpu_env())
    assert r.returncode == 2 and "NVLinkEndpoint has no send/recv" in r.stderr
    r = run_bench("--transport", "nvlink", "--device-memory", "target", *TINY, env=sim_gpu_env())
    assert r.returncode == 2 and "moves GPU memory on both sides" in r.stderr
    r = run_bench("--transport", "nvlink", "--lanes", "2", *TINY, env=sim_gpu_env())
    assert r.returncode != 0 and "--lanes and --chunk-size are TCP's" in r.stderr


def test_bench_gpu_modes_without_a_gpu_say_so(tmp_path):
    # Without a GPU runtime: exit 2 before anything runs, with the runtime's reason (it names the
    # GPU and DLSLIME_GPU_SIM); no traceback, no abort, no table.
    modes = [["--device-memory"], ["--device-memory", "target"]]
    if _nvlink_built():
        modes.append(["--transport", "nvlink"])
    for mode in modes:
        r = run_bench(*mode, *TINY, env=no_gpu_env())
        assert r.returncode == 2, (mode, r.stdout, r.stderr)
        assert "no GPU" in r.stderr and "set DLSLIME_GPU_SIM=1 to use the simulated GPU" in r.stderr, r.stderr
        assert ("--transport nvlink: not available here" if "nvlink" in mode else "--device-memory needs a GPU") \
            in r.stderr, r.stderr
        for crash in ("Traceback", "terminate called", "Aborted", "core dumped"):
            assert crash not in r.stderr
        assert "MsgSize" not in r.stdout
    # A target told by the initiator to use GPU memory refuses the same way; the initiator
    # (host memory here, so it started) reports the target's reason.
    target = subprocess.Popen(
        [sys.executable, "-m", "dlslime.bench", "--role", "target", "--listen", "127.0.0.1:0", "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=no_gpu_env(),
    )
    try:
        m = re.search(r"waiting for an initiator on (127\.0\.0\.1:\d+)", target.stderr.readline())
        assert m
        r = run_bench("--role", "initiator", "--peer", m.group(1), "--device-memory", "target", *TINY,
                      env=no_gpu_env())
        assert r.returncode == 1 and "the target failed: --device-memory needs a GPU: no GPU" in r.stderr, r.stderr
        assert target.wait(timeout=60) == 2
        assert "--device-memory needs a GPU: no GPU" in target.stderr.read()
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


# --- the ascend transport on the simulated HIXL ----------------------------------------------


def _ascend_built():
    import dlslime

    return hasattr(dlslime, "AscendDirectEndpoint")


@pytest.mark.skipif(not _ascend_built(), reason="Ascend transport not built (configure with -DBUILD_ASCEND=ON)")
@pytest.mark.parametrize("op", ["write", "read"])
def test_bench_ascend_on_the_simulated_hixl_prints_its_table_and_says_what_it_measures(tmp_path, op):
    out = tmp_path / f"ascend-{op}.json"
    env = dict(os.environ, DLSLIME_ASCEND_SIM="1")
    r = run_bench("--transport", "ascend", "--op", op, *GPU_SIZES, "--json", str(out), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"DLSlime Ascend Benchmark: {op}" in r.stdout and "MsgSize" in r.stdout
    assert "simulated HIXL (DLSLIME_ASCEND_SIM=1)" in r.stdout and "not an NPU" in r.stdout
    config = json.loads(out.read_text())["config"]
    assert config["transport"] == "ascend" and config["simulated_device"] is True
    assert config["endpoint"]["transport"] == "ascend" and config["ascend_options"]["host"] == "127.0.0.1"
    bad = run_bench("--transport", "ascend", "--op", op, *GPU_SIZES, "--inject-corruption", env=env)
    assert bad.returncode == 1 and "VERIFY FAILED" in bad.stderr, bad.stdout + bad.stderr
    r = run_bench("--transport", "ascend", "--op", "send", *TINY, env=env)
    assert r.returncode == 2 and "AscendDirectEndpoint has no send/recv" in r.stderr, r.stderr


@pytest.mark.skipif(not _ascend_built(), reason="Ascend transport not built (configure with -DBUILD_ASCEND=ON)")
def test_bench_ascend_without_the_runtime_or_the_variable_says_so():
    env = dict(os.environ)
    env.pop("DLSLIME_ASCEND_SIM", None)
    r = run_bench("--transport", "ascend", *TINY, env=env)
    assert r.returncode == 2 and "DLSLIME_ASCEND_SIM" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "MsgSize" not in r.stdout
