"""The SDK contract (sdk/contract/driver.py, the same for every SDK) with the Python SDK's
conformance agent (contract_agent.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .support.stack import Stack

HERE = Path(__file__).resolve().parent
DRIVER = HERE.parents[1] / "contract" / "driver.py"


def test_the_python_sdk_keeps_the_sdk_contract(stack: Stack) -> None:
    spec = importlib.util.spec_from_file_location("agent_reach_contract", DRIVER)
    assert spec is not None
    assert spec.loader is not None
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    driver.run([sys.executable, str(HERE / "contract_agent.py")], stack)
