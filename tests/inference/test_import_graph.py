"""The pointer follower (model_swap) and the service that starts it: the service imports the
follower, and nothing the follower imports, however indirectly (lazy imports inside functions
included), leads back to the service; the follower imports alone in a fresh process. The
repository-wide rule, no import cycle anywhere, is tests/test_import_graph.py's."""

from __future__ import annotations

import subprocess
import sys

from tests.test_import_graph import import_graph


def reached_from(graph: dict[str, set[str]], module: str) -> set[str]:
    reached, todo = set(), [module]
    while todo:
        for imported in graph[todo.pop()] - reached:
            reached.add(imported)
            todo.append(imported)
    return reached


def test_the_service_imports_the_follower_and_the_follower_never_the_service():
    graph = import_graph()
    assert "lmforge.inference.model_swap" in graph["lmforge.inference.service"]
    from_follower = reached_from(graph, "lmforge.inference.model_swap")
    assert "lmforge.inference.served_model" in from_follower  # what both use lives there
    assert "lmforge.inference.service" not in from_follower
    assert "lmforge.inference.model_swap" not in from_follower


def test_model_swap_imports_alone_in_a_fresh_process():
    done = subprocess.run([sys.executable, "-c", "import lmforge.inference.model_swap"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
