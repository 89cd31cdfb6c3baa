from setuptools import find_packages, setup

setup(
    name="nervex",
    version="0.1.0",
    description="Config-driven deep reinforcement learning in PyTorch: serial and parallel training from one YAML file.",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["nervex", "nervex.*", "app_zoo", "app_zoo.*"]),
    package_data={"app_zoo": ["**/config/*.yaml"]},
    install_requires=[
        "torch>=2.0",
        "numpy>=1.24",
        "gymnasium>=1.0",
        "easydict>=1.10",
        "pyyaml>=6.0",
        "lz4>=4.0",
        "tensorboard>=2.10",
        "tqdm>=4.60",
        # compiled replay trees (PrioritizedBuffer's speed); the buffer falls back to NumPy where numba cannot load
        "numba>=0.59",
        # the parallel mode's control plane (JSON over HTTP, served by waitress) and its bulk-data codec
        "flask>=3.0",
        "waitress>=3.0",
        "requests>=2.31",
        "safetensors>=0.4",
    ],
    extras_require={
        # the test extra pulls the optional backends too, so CI exercises Atari and MuJoCo
        "test": [
            "pytest>=7",
            "pytest-timeout>=2",
            "ruff>=0.4",
            "ale-py>=0.9",
            "opencv-python-headless>=4.8",
            "mujoco>=3.0",
            "imageio>=2.14",
            "gymnasium[box2d]>=1.0",  # LunarLander configs are smoke-tested too
            "pettingzoo[classic]>=1.24",  # the games (tic-tac-toe) and the PettingZoo adapter's tests
            # the ParallelEnv, LBF and VMAS adapters' tests, simple_spread's assignment heuristic (scipy)
            "mpe2>=1.0",
            "lbforaging>=2.0",
            "vmas>=1.5",
            "scipy>=1.10",
            # the tools (video, plot, W&B, tune) and the SUMO application, so their tests run in CI
            "moviepy>=2.0",
            "imageio[ffmpeg]>=2.14",
            "matplotlib>=3.5",
            "wandb>=0.17",
            "optuna>=3.6",
            "eclipse-sumo>=1.20",
            "libsumo>=1.20",
            "sumo-rl>=1.4.5",
            # the league: open_spiel games (Kuhn, Leduc, connect_four) and the meta-game's linear program (scipy);
            # dm-tree: open_spiel's PyTorch NFSP, the league bench's peer (its wheel does not declare it)
            "open_spiel>=2.0.2",
            "dm-tree>=0.1.8",
        ],
        # nervex -m eval --video: gymnasium's RecordVideo writes mp4 through moviepy and imageio's ffmpeg
        "video": ["moviepy>=2.0", "imageio[ffmpeg]>=2.14"],
        "plot": ["matplotlib>=3.5"],  # nervex plot
        "wandb": ["wandb>=0.17"],  # logger.wandb
        "tune": ["optuna>=3.6"],  # nervex -m tune
        "tools": ["moviepy>=2.0", "imageio[ffmpeg]>=2.14", "matplotlib>=3.5", "wandb>=0.17", "optuna>=3.6"],
        # app_zoo/sumo: SUMO traffic-signal control through sumo-rl; libsumo steps the simulation in process
        "sumo": ["eclipse-sumo>=1.20", "libsumo>=1.20", "sumo-rl>=1.4.5"],
        "fast": [],  # kept for old install commands: numba, which it used to add, is now a dependency
        "bench": [
            "stable-baselines3>=2.3",
            "tianshou>=1.0",
            "sb3-contrib>=2.3",
            "rl_zoo3>=2.3",  # bench/zoo.py reads its hyperparams/*.yml
            "matplotlib>=3.5",
            "gymnasium[box2d]>=1.0",  # LunarLander
            "benchmarl>=1.5",  # bench/marl_benchmarl.py: the peer on VMAS simple_spread
            "open_spiel>=2.0.2",  # bench/league_nfsp.py: open_spiel's PyTorch NFSP, the league's peer
            "dm-tree>=0.1.8",  # which open_spiel's PyTorch DQN/NFSP import
        ],
        "atari": ["ale-py>=0.9", "opencv-python-headless>=4.8"],  # cv2: the reference INTER_AREA resize
        "mujoco": ["mujoco>=3.0", "imageio>=2.14"],
        "box2d": [
            "gymnasium[box2d]>=1.0"
        ],  # a cp311 box2d wheel: no swig needed  # gymnasium.envs.mujoco imports imageio
        # turn-based games through nervex.envs.PettingZooAECEnv (tic-tac-toe is PettingZoo's classic/tictactoe-v3);
        # the classic family's renderer wants pygame(-ce), which PettingZoo's extra pulls
        "games": ["pettingzoo[classic]>=1.24"],
        # cooperative multi-agent: mpe2 (PettingZoo's particle envs, pulls pettingzoo) through
        # nervex.envs.PettingZooParallelEnv, Level-Based Foraging (nervex.envs.LBForagingEnv), VMAS (env_type vmas
        # with manager_type vmas); scipy for simple_spread's assignment heuristic (app_zoo.multiagent.mpe)
        "marl": ["mpe2>=1.0", "lbforaging>=2.0", "vmas>=1.5", "scipy>=1.10"],
        # the league (nervex.league): open_spiel games through env_type open_spiel, exact exploitability of Kuhn and
        # Leduc; scipy solves the meta-game's Nash mixture (matchmaking nash, league/exploitability)
        "league": ["open_spiel>=2.0.2", "scipy>=1.10"],
        "dist": [],  # kept for old install commands: the parallel mode's packages are dependencies now
    },
    entry_points={"console_scripts": ["nervex=nervex.entry.cli:main"]},
)
