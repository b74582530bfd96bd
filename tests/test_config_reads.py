"""No ``config.<section>.get(key, default)`` in the package: a config field is declared once, in
``cvs_jax/config/defaults.py``, so a reader that supplies its own default hides a missing or misspelt key
(the run would silently use the reader's value). Checked on the source: a ``.get`` call with a default whose
receiver is an attribute chain rooted at a config name (``config``, ``c``, ``cfg``)."""

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cvs_jax")
CONFIG_NAMES = {"config", "c", "cfg"}


def config_get_defaults(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
            continue
        if len(node.args) + len(node.keywords) < 2:
            continue
        receiver = node.func.value
        while isinstance(receiver, ast.Attribute):
            receiver = receiver.value
        if isinstance(receiver, ast.Name) and receiver.id in CONFIG_NAMES:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_check_sees_a_config_get_with_a_default():
    assert config_get_defaults("lr = config.train.get('lr', 0.1)") == ["1: config.train.get('lr', 0.1)"]
    assert config_get_defaults("x = c.get('method', 'cvs')") == ["1: c.get('method', 'cvs')"]
    assert config_get_defaults("x = (config or {}).get('data', {})") == []  # a JSON dict, not a ConfigDict
    assert config_get_defaults("x = config.train.lr") == []


def test_no_config_get_defaults_in_the_package():
    found = []
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path) as f:
                    found += [f"{os.path.relpath(path, PACKAGE)}:{hit}" for hit in config_get_defaults(f.read())]
    assert not found, "config fields read with a .get default (declare them in config/defaults.py): " + str(found)
