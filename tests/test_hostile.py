"""The attacks of tests/hostile.py, small: links planted in `.railcall/`, `append_file` killed
mid-write, planted policies, forged skills, the policy re-link race, a 1,000-deep tree and the
folder swap race. Each counts its attempts and its bad outcomes; none may have one.
(`python tests/hostile.py --scale 10` runs them larger.)"""

from __future__ import annotations

import pytest

import hostile


@pytest.fixture(autouse=True)
def _clean():
    yield
    hostile.cleanup()


@pytest.mark.parametrize("name", list(hostile.ATTACKS))
def test_the_attack_finds_nothing(name):
    r = hostile.ATTACKS[name](1)
    assert r.attempts >= 1
    assert r.bad == [], f"{name}: {len(r.bad)} of {r.attempts} attempts went wrong: {r.bad[:5]}"


def test_a_race_was_really_run():
    r = hostile.swap_race(1)
    swaps = int(r.extra.split()[0])
    assert swaps > 100 and r.attempts > 100, r.extra


def test_policy_plants_exercise_both_sides():
    """The random policies include ones that widen (refused) and ones that narrow (loaded)."""
    r = hostile.policy_plants(1)
    refused, loaded = int(r.extra.split()[0]), int(r.extra.split(", ")[1].split()[0])
    assert refused > 10 and loaded > 10, r.extra
