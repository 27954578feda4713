"""The agent's environment (memprof_agent/_config.py): one module reads
every variable, typed, with its default; a bad value is said once and its
default used; the docs' tables are generated from it; the bootstrap, which
must not import the package, reads MEMPROF_AGENT_DISABLE by the same rule."""

import importlib.util
import logging
import re

import pytest

from conftest import HERE, ROOT, memprof_agent

_config = memprof_agent._config
PACKAGE = HERE.parent / "memprof_agent"


def test_only_the_config_module_reads_the_agents_variables():
    named = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        named |= set(re.findall(r"MEMPROF_(?:AGENT|ESTIMATE)_[A-Z_]+[A-Z]", text))
        if path.name != "_config.py":
            reads = re.findall(r"""(?:environ|env)(?:\.get\(|\[)\s*["']MEMPROF_""", text)
            assert not reads, "%s reads the environment itself: %s" % (path.name, reads)
    assert named <= set(_config.BY_NAME), "named but not in _config.VARS: %s" % sorted(named - set(_config.BY_NAME))
    assert len(_config.VARS) == len(_config.BY_NAME) == 19


@pytest.mark.parametrize("name, raw, value", [
    ("MEMPROF_AGENT_INTERVAL", "500ms", 0.5),
    ("MEMPROF_AGENT_INTERVAL", " 2s ", 2.0),
    ("MEMPROF_AGENT_HISTORY_ENTRIES", " 7 ", 7),
    ("MEMPROF_AGENT_HISTORY_AT_HIGH", "", False),  # set but empty: off, as before
    ("MEMPROF_AGENT_HISTORY_AT_HIGH", "OFF", False),
    ("MEMPROF_AGENT_DISABLE", "yes", True),
    ("MEMPROF_AGENT_AUTO_STEP", "0", False),
    ("MEMPROF_AGENT_SIZES", " Stats ", "stats"),
    ("MEMPROF_AGENT_MAX_STEPS", "", None),
    ("MEMPROF_AGENT_OUTPUT", "", None),
    ("MEMPROF_AGENT_SOCKET", "/run/x.sock", "/run/x.sock"),
])
def test_a_value_is_typed(name, raw, value):
    assert _config.get(name, {name: raw}) == value


def test_unset_is_the_default():
    assert [_config.get(v.name, {}) for v in _config.VARS] == [v.default for v in _config.VARS]
    assert _config.get("MEMPROF_AGENT_HISTORY_AT_HIGH", {}) is True


@pytest.mark.parametrize("name, raw", [
    ("MEMPROF_AGENT_INTERVAL", "fast"),
    ("MEMPROF_AGENT_INTERVAL", "90"),
    ("MEMPROF_AGENT_HISTORY_ENTRIES", "0"),
    ("MEMPROF_AGENT_HISTORY_ENTRIES_AT_HIGH", "lots"),
    ("MEMPROF_AGENT_MAX_STEPS", "-3"),
    ("MEMPROF_AGENT_TRACKING_EVERY", "1.5"),
    ("MEMPROF_AGENT_SIZES", "snapshots"),
])
def test_a_bad_value_is_said_once_and_the_default_used(caplog, name, raw):
    caplog.set_level(logging.WARNING, logger="memprof_agent")
    env = {name: raw}
    assert [_config.get(name, env) for _ in range(3)] == [_config.BY_NAME[name].default] * 3
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("memprof-agent: %s=%r is not " % (name, raw)), said


def test_a_bad_interval_in_the_environment_still_starts_the_agent_at_the_default(fake, monkeypatch, caplog):
    monkeypatch.setenv("MEMPROF_AGENT_INTERVAL", "fast")
    assert memprof_agent.start(url="http://127.0.0.1:9/v1/agent")
    assert memprof_agent._agent.interval == _config.DEFAULT_INTERVAL
    assert any("MEMPROF_AGENT_INTERVAL='fast'" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("doc", _config.DOCS)
def test_the_docs_table_is_generated_from_the_module(doc):
    text = (ROOT / doc).read_text()
    assert _config.spliced(text) == text, \
        "%s's table of variables is stale: python3 agent/python/memprof_agent/_config.py --write" % doc


def test_the_bootstrap_reads_disable_by_the_same_rule(monkeypatch):
    spec = importlib.util.spec_from_file_location("bootstrap_site_under_test",
                                                  HERE.parent / "bootstrap" / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)  # not named sitecustomize: does not install itself
    for raw in ("", "0", "false", " No ", "OFF", "1", "true", "yes", "anything"):
        monkeypatch.setenv("MEMPROF_AGENT_DISABLE", raw)
        assert site._disabled() == _config.get("MEMPROF_AGENT_DISABLE"), raw
