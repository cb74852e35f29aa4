"""The torch-free catalog that config validation reads names every registered variant as the registries do."""

import subprocess
import sys

from stratarl.algo import catalog
from stratarl.algo.advantages import ADVANTAGE_ESTIMATORS
from stratarl.algo.aggregation import LOSS_AGGREGATIONS
from stratarl.algo.distillation import DISTILLATION_LOSSES
from stratarl.algo.kl import KL_ESTIMATORS
from stratarl.algo.kl_control import KL_CONTROLLERS
from stratarl.algo.policy_filtration import PF_PPO_WEIGHTS
from stratarl.algo.policy_loss import POLICY_LOSSES


def test_estimators_and_the_fields_they_require_match_the_registry():
    assert {name: e.inputs for name, e in ADVANTAGE_ESTIMATORS.items()} == catalog.ESTIMATOR_INPUTS


def test_policy_losses_and_their_forced_aggregations_match_the_registry():
    registered = {name: loss.forced_aggregation for name, loss in POLICY_LOSSES.items()}
    assert registered == catalog.POLICY_LOSS_AGGREGATION


def test_aggregations_kl_estimators_and_controllers_match_their_registries():
    assert list(LOSS_AGGREGATIONS) == list(catalog.LOSS_AGGREGATION_NAMES)
    assert sorted(KL_ESTIMATORS) == sorted(catalog.KL_ESTIMATOR_NAMES)
    assert sorted(KL_CONTROLLERS) == sorted(catalog.KL_CONTROLLER_NAMES)
    assert list(PF_PPO_WEIGHTS) == list(catalog.PF_PPO_REWEIGHT_METHODS)


def test_distillation_losses_and_what_they_need_match_the_registry():
    kinds = {name: (d.uses_top_k, d.teaches_when_backpropagated) for name, d in DISTILLATION_LOSSES.items()}
    assert kinds == catalog.DISTILLATION_LOSS_KINDS


def test_the_catalog_imports_no_torch():
    code = "import sys, stratarl.algo.catalog; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
