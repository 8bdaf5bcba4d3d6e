"""The runner of PyTorch's device-generic suites: pairing a test's CPU and neuron instances, the share, the
causes, and a run that survives a test killing its process."""
import textwrap

import pytest

from torchneuron.conformance import suites


@pytest.mark.parametrize(
    "nodeid, key, device",
    [
        ("s.py::TestFooCPU::test_bar_cpu_float32", "s.py::TestFoo::test_bar_float32", "cpu"),
        ("s.py::TestFooPRIVATEUSE1::test_bar_neuron_float32", "s.py::TestFoo::test_bar_float32", "neuron"),
        ("s.py::TestFooNEURON::test_bar_neuron", "s.py::TestFoo::test_bar", "neuron"),
        ("s.py::TestFooCPU::test_cpu_indices_cpu", "s.py::TestFoo::test_cpu_indices", "cpu"),
        ("s.py::TestFooPRIVATEUSE1::test_neuron_x_neuron", "s.py::TestFoo::test_neuron_x", "neuron"),
        ("s.py::TestFooMETA::test_bar_meta", None, None),
    ],
)
def test_a_tests_instances_pair_by_their_generic_name(nodeid, key, device):
    assert suites.test_key(nodeid) == (key, device)


def _record(cls, name, outcome, message=""):
    return {"nodeid": f"s.py::{cls}::{name}", "outcome": outcome, "message": message}


def test_the_share_counts_cpu_passing_tests_that_run_on_neuron_and_groups_failures():
    records = [
        _record("TCPU", "test_a_cpu", "passed"), _record("TPRIVATEUSE1", "test_a_neuron", "passed"),
        _record("TCPU", "test_b_cpu", "passed"),
        _record("TPRIVATEUSE1", "test_b_neuron", "failed", "IndexError: index 7 is out of bounds\nmore"),
        _record("TCPU", "test_c_cpu", "passed"),
        _record("TPRIVATEUSE1", "test_c_neuron", "failed", "IndexError: index 12 is out of bounds"),
        _record("TCPU", "test_d_cpu", "passed"), _record("TPRIVATEUSE1", "test_d_neuron", "skipped"),
        _record("TCPU", "test_e_cpu", "failed"), _record("TPRIVATEUSE1", "test_e_neuron", "failed", "x"),
        _record("TCPU", "test_f_cpu", "xfailed"), _record("TPRIVATEUSE1", "test_f_neuron", "xfailed"),
        _record("TCPU", "test_g_cpu", "passed"),
    ]
    summary = suites.compare(records)
    assert (summary["cpu_passing"], summary["counted"], summary["neuron_passing"]) == (6, 4, 2)
    assert summary["skipped_on_neuron"] == ["s.py::T::test_d"]
    assert summary["not_run_on_neuron"] == ["s.py::T::test_g"]
    assert summary["causes"] == {"IndexError: index N is out of bounds": ["s.py::T::test_b", "s.py::T::test_c"]}
    assert suites.share(summary) == "50.0%"


SUITE = '''
import os
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, onlyCPU
from torch.testing._internal.common_utils import TestCase


class TestTiny(TestCase):
    def test_ones(self, device):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 2.0)

    def test_dies(self, device):
        if device != "cpu":
            os.abort()

    @onlyCPU
    def test_cpu_only(self, device):
        pass

    def test_zeros(self, device):
        self.assertEqual(torch.zeros(2, device=device).sum().item(), 0.0)


instantiate_device_type_tests(TestTiny, globals())
'''


@pytest.mark.slow
def test_a_suite_runs_on_both_devices_past_a_test_that_kills_its_process(tmp_path):
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(SUITE))
    summary = suites.compare(suites.run_suite(tmp_path / "test_tiny.py", tmp_path / "results.jsonl"))
    assert (summary["cpu_passing"], summary["counted"], summary["neuron_passing"]) == (4, 3, 2)
    assert list(summary["causes"]) == ["process died (exit code -N)"]
