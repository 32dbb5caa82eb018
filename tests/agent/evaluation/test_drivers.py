"""agent/evaluation/drivers.py: the checkpoints loaded as drivers with what metrics.json records about each, the
checks of a student's actions against the env's, and the expert's baseline row."""
from types import SimpleNamespace

import pytest

from agent.evaluation.config import Conditions, Drivers
from agent.evaluation.drivers import check_actions, env_action_names, expert_meta, policy_drivers
from agent.evaluation.timing import TimingConditions
from tests.helpers import constant_policy_checkpoint


def _drivers(checkpoints=(), **kw):
    base = dict(checkpoints=tuple(str(c) for c in checkpoints), names=(), expert=None, expert_drives=False,
                with_expert=False, action_space=None, discrete_actions=None, action_temperature=None, spared=(),
                spares_given=False, pi_speed=False)
    return Drivers(**{**base, **kw})


CONDITIONS = Conditions(TimingConditions(), "steps", 0.0)


def _cfg(names, head="continuous", fixed_throttle=None):
    return SimpleNamespace(head=head, action_names=tuple(names), fixed_throttle=fixed_throttle,
                           action_space="discrete" if head == "discrete" else "continuous", discrete_actions="argmax")


def test_a_student_fills_only_steering_under_a_pi_speed_controller():
    assert env_action_names("udacity-hard", pi_speed=True) == ["steer"]
    assert env_action_names("udacity-hard", pi_speed=False) is None, "None: the student's own env's action"
    assert env_action_names("carracing", pi_speed=False) is None


def test_the_expert_driving_loads_no_checkpoint():
    drivers, space = policy_drivers(_drivers(["no/such.pt"], expert_drives=True), CONDITIONS, "carracing", "cpu")
    assert drivers == [] and space == "continuous"
    _, space = policy_drivers(_drivers(expert_drives=True, action_space="discrete"), CONDITIONS, "carracing", "cpu")
    assert space == "discrete"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {"continuous": constant_policy_checkpoint(root / "c.pt"),
            "discrete": constant_policy_checkpoint(root / "d.pt", action_space="discrete", discrete_actions="sample")}


def test_each_checkpoint_drives_under_its_name_with_what_its_metrics_record(ckpts):
    a = ckpts["continuous"]
    drivers, space = policy_drivers(_drivers([a, a], names=("first", "second")), CONDITIONS, "carracing", "cpu")
    assert space == "continuous" and [d.name for d in drivers] == ["first", "second"]
    meta = drivers[0].meta
    assert meta["source"] == str(a) and meta["window_clock"] == "steps" and meta["filled_from_expert"] == []
    policy = drivers[0].controller.policy
    assert meta["num_parameters"] == sum(p.numel() for p in policy.parameters()) > 0
    assert meta["policy_config"]["env"] == "CarRacing-v3"
    assert "discrete_actions" not in meta and "latency_input" not in meta, "only what applies to the student"


def test_a_discrete_student_records_its_action_rule_temperature_and_spared_actions(ckpts):
    [driver], space = policy_drivers(_drivers([ckpts["discrete"]], action_temperature=2.0, spared=(4,),
                                              spares_given=True), CONDITIONS, "carracing", "cpu")
    assert space == "discrete"
    assert (driver.meta["discrete_actions"], driver.meta["action_temperature"]) == ("sample", 2.0)
    assert driver.meta["temperature_spares"] == ["brake"]


def test_a_student_must_predict_the_actions_its_env_is_driven_with():
    steer = _cfg(["steer"])
    with pytest.raises(ValueError, match=r"predicts steering only, but udacity-hard is driven with "
                                         r"\['steer', 'throttle'\]; pass --pi-speed"):
        check_actions(_drivers(), "udacity-hard", "s.pt", steer)
    check_actions(_drivers(pi_speed=True), "udacity-hard", "s.pt", steer)
    check_actions(_drivers(), "udacity-hard", "s.pt", _cfg(["steer"], fixed_throttle=0.3))  # its throttle is fixed
    with pytest.raises(ValueError, match=r"predicts \['steer', 'throttle'\], but udacity-hard with --pi-speed is "
                                         r"driven with \['steer'\]"):
        check_actions(_drivers(pi_speed=True), "udacity-hard", "s.pt", _cfg(["steer", "throttle"]))
    check_actions(_drivers(), "carracing", "c.pt", _cfg(["steer"]))  # no PI controller there: its own env's action


def test_discrete_action_options_need_a_discrete_student():
    with pytest.raises(ValueError, match="--discrete-actions sample is for discrete students; checkpoint 'c.pt' has "
                                         "a continuous head"):
        check_actions(_drivers(discrete_actions="sample"), "carracing", "c.pt", _cfg(["steer", "gas", "brake"]))
    with pytest.raises(ValueError, match="--action-temperature changes only the sample and dither rules"):
        check_actions(_drivers(action_temperature=2.0), "carracing", "d.pt", _cfg(["noop"], head="discrete"))


def test_the_expert_baseline_keeps_its_cards_headline_and_seed_range():
    card = {"evaluation": {"seeds": list(range(1000, 1020)), "mean_return": 900.0, "laps_finished": 19,
                           "returns": [1.0] * 20}}
    meta = expert_meta(SimpleNamespace(path="checkpoints/e.zip", card=card))
    assert meta == {"source": "checkpoints/e.zip", "expert_card_evaluation": {
        "mean_return": 900.0, "laps_finished": 19, "seeds": "1000..1019"}}
    assert expert_meta(SimpleNamespace(path=None, card={}))["expert_card_evaluation"] == {}
