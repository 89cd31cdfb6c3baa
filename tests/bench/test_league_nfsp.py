"""bench/league_nfsp.py: open_spiel's PyTorch NFSP as the league's peer (records, exploitability, determinism)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyspiel")
pytest.importorskip("open_spiel.python.pytorch.nfsp")  # needs dm-tree, which the open_spiel wheel does not declare

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import league_nfsp  # noqa: E402

# Small buffers and frequent updates so that the average network trains within a few hundred Kuhn episodes
# (the example's settings start learning only after 1000 reservoir entries: ~10k episodes).
FAST = dict(min_buffer_size_to_learn=16, batch_size=16, learn_every=4, anticipatory_param=0.5)


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def untrained_average_exploitability(game_name: str, seed: int) -> float:
    """Exploitability of the average networks NFSP starts from, read into a tabular policy (no NFSPPolicies)."""
    import pyspiel
    from open_spiel.python import policy
    from open_spiel.python.algorithms import exploitability
    from open_spiel.python.pytorch import nfsp

    game = pyspiel.load_game(game_name)
    size, n_actions = game.information_state_tensor_size(), game.num_distinct_actions()
    agents = [nfsp.NFSP(p, size, n_actions, [128], int(2e6), 0.1, seed=seed) for p in range(2)]
    tabular = policy.TabularPolicy(game)
    for state in tabular.states:
        player = state.current_player()
        with torch.no_grad():
            logits = agents[player]._avg_network(torch.tensor([state.information_state_tensor(player)]))[0].numpy()
        legal = state.legal_actions(player)
        probs = np.exp(logits[legal] - logits[legal].max())
        row = tabular.policy_for_key(state.information_state_string(player))
        row[:] = 0.0
        row[legal] = probs / probs.sum()
    return float(exploitability.exploitability(game, tabular))


def test_a_short_run_starts_from_the_exploitability_of_the_untrained_average_policy():
    rec = league_nfsp.run_nfsp("kuhn_poker", 3, seconds=None, episodes=300, eval_every=300, eval_seconds=None)
    expected = untrained_average_exploitability("kuhn_poker", 3)
    assert 0.2 < expected < 1.0  # near-uniform nets: Kuhn's uniform policy is 0.458333 exploitable
    assert [p["episodes"] for p in rec["curve"]] == [0, 300]
    assert rec["curve"][0]["exploitability"] == pytest.approx(expected, abs=1e-6)
    # the example's settings learn nothing in 300 episodes (under 1000 reservoir entries), so the policy is unchanged
    assert rec["curve"][1]["exploitability"] == pytest.approx(expected, abs=1e-6)
    assert rec["curve"][0]["wall_secs"] == 0.0 < rec["curve"][1]["wall_secs"] == rec["train_secs"]
    assert rec["curve"][0]["cpu_secs"] == 0.0 < rec["curve"][1]["cpu_secs"] == rec["train_cpu_secs"]
    assert rec["episodes"] == 300 and rec["episodes_per_sec"] == pytest.approx(300 / rec["train_secs"])
    assert rec["first_below"] == {"0.1": None, "0.05": None}
    assert rec["settings"]["epsilon_decay_duration"] == 3_000_000  # the Kuhn example's, not Leduc's 20e6
    assert rec["settings"]["update_target_network_every"] == 1000  # DQN's default, which the Kuhn example keeps
    assert rec["settings"]["replay_buffer_capacity"] == 200_000 and rec["settings"]["hidden_layers_sizes"] == [128]


def test_a_run_is_reproducible_per_seed_and_evaluation_does_not_change_it():
    def curve(seed, eval_every):
        rec = league_nfsp.run_nfsp(
            "kuhn_poker", seed, seconds=None, episodes=120, eval_every=eval_every, eval_seconds=None, overrides=FAST
        )
        return {p["episodes"]: p["exploitability"] for p in rec["curve"]}

    first = curve(1, 60)
    assert list(first) == [0, 60, 120]
    assert first[120] != pytest.approx(first[0], abs=1e-3)  # the average network did train
    assert curve(1, 120) == {0: first[0], 120: first[120]}  # the same seed again, fewer evaluations: same training
    assert curve(2, 120)[120] != pytest.approx(first[120], abs=1e-6)


def test_the_command_line_writes_one_record_per_seed(tmp_path):
    argv = ["--game", "kuhn_poker", "--seeds", "0", "1", "--episodes", "50", "--out", str(tmp_path), "--verbose"]
    assert league_nfsp.main(argv) == 0
    rec = json.loads((tmp_path / "kuhn_poker__open_spiel_nfsp__seed1.json").read_text())
    assert rec["command"] == "python bench/league_nfsp.py --game kuhn_poker --seeds 0 1 --episodes 50"
    assert rec["seed"] == 1 and rec["game"] == "kuhn_poker" and rec["episodes"] == 50
    assert rec["evaluation"]["eval_every"] == 10_000  # the examples' schedule when none is given
    assert rec["machine"]["versions"]["open_spiel"] and rec["machine"]["cpu_count"] >= 1
    assert "nfsp_kuhn_pytorch.py" in rec["settings_source"]
    assert (tmp_path / "kuhn_poker__open_spiel_nfsp__seed0.json").exists()


def test_first_below_returns_the_first_point_under_the_threshold():
    curve = [dict(episodes=0, wall_secs=0.0, cpu_secs=0.0, exploitability=0.4)]
    curve.append(dict(episodes=10, wall_secs=2.0, cpu_secs=1.5, exploitability=0.08))
    curve.append(dict(episodes=20, wall_secs=4.0, cpu_secs=3.0, exploitability=0.04))
    assert league_nfsp.first_below(curve, 0.1) == {"episodes": 10, "wall_secs": 2.0, "cpu_secs": 1.5}
    assert league_nfsp.first_below(curve, 0.05) == {"episodes": 20, "wall_secs": 4.0, "cpu_secs": 3.0}
    assert league_nfsp.first_below(curve, 0.01) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seconds=None, episodes=None), "give seconds or episodes"),
        (dict(seconds=None, episodes=0), "episodes=0 must be positive"),
        (dict(seconds=1.0, episodes=None, overrides={"learn_evry": 4}), "unknown NFSP setting"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        league_nfsp.run_nfsp("kuhn_poker", 0, eval_every=None, eval_seconds=None, **kwargs)


def test_a_game_without_an_example_is_refused():
    with pytest.raises(ValueError, match="no open_spiel NFSP example for game 'tic_tac_toe'"):
        league_nfsp.resolved_settings("tic_tac_toe")
