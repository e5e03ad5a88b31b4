"""bench/router_overhead.py's arithmetic: the room nginx's run leaves the router, and CPU
taken as a rate over each slice (its warm-up included) rather than over the window."""

from __future__ import annotations

import pytest

from bench.router_overhead import GOAL_OF_NGINX, Slices, room


def test_a_router_that_spends_its_room_answers_the_goal_share_of_nginx():
    # nginx's run: 1,000 answers, the machine busy 0.2 s for them, 0.02 s of it nginx's.
    nginx_answers, nginx_machine, nginx_own = 1000, 0.2, 0.02
    allowed = room(nginx_machine, nginx_own, nginx_answers)
    assert allowed == pytest.approx(70e-6)
    # The router at exactly that CPU an answer, the rest (load, engine, kernel) the same,
    # the machine as busy: its answers a second are the goal's share of nginx's.
    rest = nginx_machine / nginx_answers - nginx_own / nginx_answers
    busy_cores = 1.8
    nginx_rate = busy_cores / (nginx_machine / nginx_answers)
    router_rate = busy_cores / (rest + allowed)
    assert router_rate / nginx_rate == pytest.approx(GOAL_OF_NGINX)
    # A dearer router has less room left than it spends: under the goal.
    assert busy_cores / (rest + allowed * 1.5) / nginx_rate < GOAL_OF_NGINX


def test_slices_take_cpu_as_a_rate_over_their_wall_time():
    slices = Slices()
    slices.add(wall=1.3, own=0.26, machine=2.6)  # a 1 s window after a 0.3 s warm-up
    slices.add(wall=1.3, own=0.26, machine=2.6)
    own, machine = slices.in_window(2.0)
    assert own == pytest.approx(0.4)  # 0.2 cores of the router's, for 2 s of windows
    assert machine == pytest.approx(4.0)
    assert Slices().in_window(2.0) == (0.0, 0.0)  # a target that never ran: nothing
