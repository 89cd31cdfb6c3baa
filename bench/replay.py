"""Replay buffer speed and memory: nervex vs Tianshou's PrioritizedReplayBuffer and SB3's uniform ReplayBuffer.

Measured in one run, each figure the median of ``--repeats`` timed runs (obs dim 4, fields obs, action, reward,
next_obs, terminated, truncated):

* adding transitions one at a time and in batches of 8 (transitions/s);
* sample + priority update, torch tensors out, for batch 64 and 256 on 100k and 1M stored transitions (batches/s;
  SB3 is uniform, so it only samples);
* peak memory (RSS) of Atari-sized transitions (4x84x84 uint8 obs and next_obs) with and without lz4 compression,
  measured in a fresh subprocess per variant; ``--frames`` transitions (real ALE Breakout frames when ale_py is
  installed, else synthetic ones), projected to 1M.

Peers are imported here only; one that is not installed is skipped with a message.

    python bench/replay.py                       # full run (about 2-3 minutes on 2 cores)
    python bench/replay.py --sizes 100000 --frames 5000 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Callable, Dict, List, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.filterwarnings("ignore")

OBS_DIM = 4
ADD_CAPACITY = 100_000


# ---- timing ----------------------------------------------------------------------------------------------------
def rate(step: Callable[[], None], items_per_step: int, min_time: float) -> float:
    """Items per second of ``step``, run in chunks until ``min_time`` seconds have passed."""
    for _ in range(3):
        step()
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(20):
            step()
        n += 20
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return n * items_per_step / elapsed


def median_rates(
    makers: Dict[str, Callable[[], Callable[[], None]]], items: int, repeats: int, min_time: float
) -> Dict[str, float]:
    """Median rate of each library over ``repeats`` rounds; each round times every library once, in turn, so a slow
    spell of the machine (the other core busy, a frequency change) falls on all of them alike."""
    runs: Dict[str, List[float]] = {name: [] for name in makers}
    for _ in range(repeats):
        for name, make_step in makers.items():
            runs[name].append(rate(make_step(), items, min_time))
    return {name: statistics.median(r) for name, r in runs.items()}


def transitions(n: int, seed: int = 0) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return dict(
        obs=rng.standard_normal((n, OBS_DIM)).astype(np.float32),
        action=rng.integers(0, 2, n),
        reward=rng.standard_normal(n).astype(np.float32),
        next_obs=rng.standard_normal((n, OBS_DIM)).astype(np.float32),
        terminated=rng.random(n) < 0.01,
        truncated=np.zeros(n, dtype=bool),
    )


# ---- libraries ---------------------------------------------------------------------------------------------------
class Nervex:
    def __init__(self, prioritized: bool, backend: Optional[str] = None) -> None:
        self.prioritized, self.backend = prioritized, backend

    def make(self, maxlen: int):
        from nervex.data import PrioritizedBuffer, ReplayBuffer

        old = os.environ.get("NERVEX_TREE_BACKEND")
        if self.backend:
            os.environ["NERVEX_TREE_BACKEND"] = self.backend
        try:
            return PrioritizedBuffer(maxlen=maxlen, seed=0) if self.prioritized else ReplayBuffer(maxlen=maxlen, seed=0)
        finally:
            if old is None:
                os.environ.pop("NERVEX_TREE_BACKEND", None)
            else:
                os.environ["NERVEX_TREE_BACKEND"] = old

    def add_one(self, data: Dict[str, np.ndarray]) -> Callable[[], Callable[[], None]]:
        def make_step():
            buf, i = self.make(ADD_CAPACITY), [0]
            obs, act, rew, nobs, term, trunc = (
                data[k] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")
            )

            def step():
                j = i[0] = (i[0] + 1) % len(obs)
                buf.append(
                    dict(
                        obs=obs[j],
                        action=int(act[j]),
                        reward=float(rew[j]),
                        next_obs=nobs[j],
                        terminated=bool(term[j]),
                        truncated=bool(trunc[j]),
                    )
                )

            return step

        return make_step

    def add_batch(self, data: Dict[str, np.ndarray], k: int) -> Callable[[], Callable[[], None]]:
        def make_step():
            buf, i, n = self.make(ADD_CAPACITY), [0], len(data["obs"]) // k

            def step():
                j = i[0] = (i[0] + 1) % n
                buf.extend_batch({key: v[j * k : (j + 1) * k] for key, v in data.items()})

            return step

        return make_step

    def filled(self, data: Dict[str, np.ndarray]):
        buf = self.make(len(data["obs"]))
        buf.extend_batch(data)
        return buf

    def sample_update(self, buf, batch: int, prios: List[np.ndarray]) -> Callable[[], Callable[[], None]]:
        def make_step():
            i = [0]

            def step():
                drawn = buf.sample(batch)
                if self.prioritized:
                    i[0] += 1
                    buf.update(prios[i[0] % len(prios)], unique_id=drawn["unique_id"])

            return step

        return make_step


class Tianshou:
    def __init__(self) -> None:
        import tianshou  # noqa: F401  (ImportError -> skipped)
        from tianshou.data import Batch, PrioritizedReplayBuffer, PrioritizedVectorReplayBuffer

        self.Batch, self.PER, self.VPER = Batch, PrioritizedReplayBuffer, PrioritizedVectorReplayBuffer

    def add_one(self, data):
        def make_step():
            buf, i = self.PER(ADD_CAPACITY, alpha=0.6, beta=0.4), [0]

            def step():
                j = i[0] = (i[0] + 1) % len(data["obs"])
                buf.add(
                    self.Batch(
                        obs=data["obs"][j],
                        act=data["action"][j],
                        rew=data["reward"][j],
                        terminated=data["terminated"][j],
                        truncated=data["truncated"][j],
                        obs_next=data["next_obs"][j],
                    )
                )

            return step

        return make_step

    def add_batch(self, data, k):
        def make_step():
            buf, i, n = self.VPER(ADD_CAPACITY, k, alpha=0.6, beta=0.4), [0], len(data["obs"]) // k
            ids = np.arange(k)

            def step():
                j = i[0] = (i[0] + 1) % n
                s = slice(j * k, (j + 1) * k)
                buf.add(
                    self.Batch(
                        obs=data["obs"][s],
                        act=data["action"][s],
                        rew=data["reward"][s],
                        terminated=data["terminated"][s],
                        truncated=data["truncated"][s],
                        obs_next=data["next_obs"][s],
                    ),
                    buffer_ids=ids,
                )

            return step

        return make_step

    def filled(self, data):
        n = len(data["obs"])
        buf = self.PER(n, alpha=0.6, beta=0.4)
        # adding 1M transitions one by one takes ~1 minute; set the storage directly, then what add() would set
        buf.set_batch(
            self.Batch(
                obs=data["obs"],
                act=data["action"],
                rew=data["reward"],
                terminated=data["terminated"],
                truncated=data["truncated"],
                done=data["terminated"] | data["truncated"],
                obs_next=data["next_obs"],
            )
        )
        buf._size, buf._insertion_idx = n, 0
        buf.init_weight(np.arange(n))
        return buf

    def sample_update(self, buf, batch, prios):
        def make_step():
            i = [0]

            def step():
                b, idx = buf.sample(batch)
                b.to_torch_()
                i[0] += 1
                buf.update_weight(idx, prios[i[0] % len(prios)])

            return step

        return make_step


class SB3:
    def __init__(self) -> None:
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer

        self.RB = ReplayBuffer
        self.obs_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        self.act_space = gym.spaces.Discrete(2)

    def make(self, n: int, n_envs: int = 1):
        return self.RB(n, self.obs_space, self.act_space, device="cpu", n_envs=n_envs)

    def add_one(self, data):
        def make_step():
            buf, i, info = self.make(ADD_CAPACITY), [0], [{}]

            def step():
                j = i[0] = (i[0] + 1) % len(data["obs"])
                s = slice(j, j + 1)
                buf.add(
                    data["obs"][s],
                    data["next_obs"][s],
                    data["action"][s],
                    data["reward"][s],
                    data["terminated"][s] | data["truncated"][s],
                    info,
                )

            return step

        return make_step

    def add_batch(self, data, k):
        def make_step():
            buf, i, n, infos = self.make(ADD_CAPACITY // k, k), [0], len(data["obs"]) // k, [{}] * k

            def step():
                j = i[0] = (i[0] + 1) % n
                s = slice(j * k, (j + 1) * k)
                buf.add(
                    data["obs"][s],
                    data["next_obs"][s],
                    data["action"][s],
                    data["reward"][s],
                    data["terminated"][s] | data["truncated"][s],
                    infos,
                )

            return step

        return make_step

    def filled(self, data):
        n = len(data["obs"])
        buf = self.make(n)
        buf.observations[:, 0] = data["obs"]
        buf.next_observations[:, 0] = data["next_obs"]
        buf.actions[:, 0, 0] = data["action"]
        buf.rewards[:, 0] = data["reward"]
        buf.dones[:, 0] = data["terminated"]
        buf.pos, buf.full = 0, True
        return buf

    def sample_update(self, buf, batch, prios):
        return lambda: lambda: buf.sample(batch)


def load_libraries() -> Dict[str, object]:
    from nervex.data.tree import numba_available

    libs: Dict[str, object] = {}
    if numba_available():
        libs["nervex PER (numba)"] = Nervex(True, "numba")
    else:
        print("[bench] numba not installed: nervex runs its NumPy tree backend only")
    libs["nervex PER (numpy)"] = Nervex(True, "numpy")
    libs["nervex uniform"] = Nervex(False)
    for name, cls in (("tianshou PER", Tianshou), ("sb3 uniform", SB3)):
        try:
            libs[name] = cls()
        except ImportError as error:
            print(f"[bench] skipping {name}: {error}")
    return libs


# ---- speed -------------------------------------------------------------------------------------------------------
def speed(libs: Dict[str, object], sizes: List[int], batches: List[int], repeats: int, min_time: float) -> List[dict]:
    rows = []
    add_data = transitions(20_000, seed=1)
    for label, fn in (
        ("add 1 at a time (trans/s)", lambda lib: lib.add_one(add_data)),
        ("add batches of 8 (trans/s)", lambda lib: lib.add_batch(add_data, 8)),
    ):
        items = 8 if "batches" in label else 1
        # adding does not depend on the tree backend
        skip = "nervex PER (numpy)" if "nervex PER (numba)" in libs else None
        row = {
            "what": label,
            **median_rates({n: fn(lib) for n, lib in libs.items() if n != skip}, items, repeats, min_time),
        }
        for name in libs:
            if name in row:
                print(f"  {label:30s} {name:22s} {row[name]:12,.0f}", flush=True)
        rows.append(row)
    prios = [np.abs(np.random.default_rng(i).standard_normal(max(batches))) + 1e-3 for i in range(512)]
    for size in sizes:
        data = transitions(size)
        filled = {name: lib.filled(data) for name, lib in libs.items()}
        for batch in batches:
            row = {"what": f"sample+update N={size:,} B={batch} (batches/s)"}
            p = [x[:batch] for x in prios]
            makers = {name: lib.sample_update(filled[name], batch, p) for name, lib in libs.items()}
            row.update(median_rates(makers, 1, repeats, min_time))
            for name in libs:
                print(f"  {row['what']:30s} {name:22s} {row[name]:12,.0f}", flush=True)
            rows.append(row)
        del filled
    return rows


# ---- memory ------------------------------------------------------------------------------------------------------
def make_frames(n: int, path: str) -> str:
    """``n + 4`` single 84x84 uint8 frames: real Breakout frames under a random policy, or synthetic ones."""
    frames = np.empty((n + 4, 84, 84), dtype=np.uint8)
    try:
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        env = gym.wrappers.AtariPreprocessing(
            gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0), frame_skip=4, screen_size=84
        )
        obs, _ = env.reset(seed=0)
        rng = np.random.default_rng(0)
        for t in range(n + 4):
            frames[t] = obs
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            if terminated or truncated:
                obs, _ = env.reset()
        env.close()
        source = "ALE Breakout, random policy"
    except Exception as error:  # no ALE: flat background with a moving block
        print(f"[bench] ALE unavailable ({type(error).__name__}); using synthetic frames")
        for t in range(n + 4):
            frames[t] = 40
            r, c = (7 * t) % 70, (11 * t) % 70
            frames[t, r : r + 8, c : c + 14] = 200
        source = "synthetic (flat background, moving block)"
    np.save(path, frames)
    return source


def peak_rss_kb() -> int:
    """Peak resident memory of this process. VmHWM, because ru_maxrss survives exec and would report the parent's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def memory_worker(variant: str, frames_path: str, n: int) -> None:
    """Fill one buffer with ``n`` Atari transitions; print peak RSS growth (MB) and sampling time as JSON."""
    frames = np.load(frames_path)
    import torch  # noqa: F401  (imported before the baseline so its memory is not counted)

    from nervex.data import ReplayBuffer

    base = peak_rss_kb()
    chunk = 500
    if variant.startswith("nervex"):
        buf = ReplayBuffer(maxlen=n, compress_fields=("obs", "next_obs") if variant == "nervex lz4" else (), seed=0)
        add = buf.extend_batch
    else:
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

        space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        sb = SB3Buffer(
            n, space, gym.spaces.Discrete(4), device="cpu", optimize_memory_usage=True, handle_timeout_termination=False
        )

        def add(b):
            for i in range(len(b["obs"])):
                sb.add(
                    b["obs"][i : i + 1],
                    b["next_obs"][i : i + 1],
                    b["action"][i : i + 1],
                    b["reward"][i : i + 1],
                    b["terminated"][i : i + 1],
                    [{}],
                )

    start = time.perf_counter()
    for s in range(0, n, chunk):
        k = min(chunk, n - s)
        stack = np.lib.stride_tricks.sliding_window_view(frames[s : s + k + 4], 4, axis=0).transpose(0, 3, 1, 2)
        add(
            dict(
                obs=np.ascontiguousarray(stack[:k]),
                next_obs=np.ascontiguousarray(stack[1 : k + 1]),
                action=np.zeros(k, np.int64),
                reward=np.zeros(k, np.float32),
                terminated=np.zeros(k, bool),
            )
        )
    fill_s = time.perf_counter() - start
    sample = (lambda: buf.sample(32)) if variant.startswith("nervex") else (lambda: sb.sample(32))
    start = time.perf_counter()
    for _ in range(100):
        sample()
    sample_ms = (time.perf_counter() - start) * 10
    peak = peak_rss_kb()
    print(json.dumps({"peak_mb": (peak - base) / 1024, "fill_s": fill_s, "sample_ms": sample_ms}))


def memory(frames: int, variants: List[str]) -> List[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "frames.npy")
        source = make_frames(frames, path)
        print(f"  frames: {frames:,} transitions, {source}")
        for variant in variants:
            out = subprocess.run(
                [sys.executable, __file__, "--memory-worker", variant, "--frames-file", path, "--frames", str(frames)],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                print(f"[bench] memory {variant} failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            res = json.loads(out.stdout.strip().splitlines()[-1])
            res.update(variant=variant, per_1m_gb=res["peak_mb"] / frames * 1e6 / 1024)
            print(
                f"  {variant:12s} peak +{res['peak_mb']:8.1f} MB  (1M: ~{res['per_1m_gb']:6.1f} GB)  "
                f"fill {res['fill_s']:.1f}s  sample(32) {res['sample_ms']:.2f} ms",
                flush=True,
            )
            rows.append(res)
    return rows


# ---- report ------------------------------------------------------------------------------------------------------
def print_table(rows: List[dict], libs: List[str]) -> None:
    ours = "nervex PER (numba)" if "nervex PER (numba)" in libs else "nervex PER (numpy)"
    cols = libs + [f"{ours.split(' (')[0]}/tianshou", "nervex/sb3"]
    print("\n" + f"{'':44s}" + "".join(f"{c:>22s}" for c in cols))
    for row in rows:
        cells = [f"{row[c]:>22,.0f}" if c in row else f"{'-':>22s}" for c in libs]
        # adds compare nervex's PER buffer (sample rows: its default backend) with each peer
        mine = row.get(ours, row.get("nervex PER (numba)"))
        ts, sb = row.get("tianshou PER"), row.get("sb3 uniform")
        cells.append(f"{mine / ts:>21.2f}x" if mine and ts else f"{'-':>22s}")
        cells.append(f"{mine / sb:>21.2f}x" if mine and sb else f"{'-':>22s}")
        print(f"{row['what']:44s}" + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000", help="stored transitions for sample+update")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (the median is reported)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per timed run")
    parser.add_argument("--frames", type=int, default=20_000, help="Atari transitions for the memory test (0: skip)")
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    parser.add_argument("--frames-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        memory_worker(args.memory_worker, args.frames_file, args.frames)
        return
    print(
        f"[bench] replay buffers; machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} "
        "(figures are only comparable within one run)"
    )
    libs = load_libraries()
    start = time.perf_counter()
    rows = speed(
        libs,
        [int(s) for s in args.sizes.split(",")],
        [int(b) for b in args.batches.split(",")],
        args.repeats,
        args.min_time,
    )
    print_table(rows, list(libs))
    if args.frames > 0:
        print("\nAtari memory (4x84x84 uint8 obs + next_obs per transition; peak RSS growth in a fresh process):")
        variants = ["nervex raw", "nervex lz4"] + (["sb3 optimized"] if "sb3 uniform" in libs else [])
        res = memory(args.frames, variants)
        raw = next((r for r in res if r["variant"] == "nervex raw"), None)
        lz4 = next((r for r in res if r["variant"] == "nervex lz4"), None)
        if raw and lz4:
            print(
                f"  lz4 saves {1 - lz4['peak_mb'] / raw['peak_mb']:.0%} of the memory "
                f"({raw['peak_mb'] / max(lz4['peak_mb'], 1e-9):.1f}x smaller)"
            )
    print(f"\n[bench] done in {time.perf_counter() - start:.0f}s; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
