"""Tool definitions: the page's names, arguments, defaults and ranges, in three formats."""

from __future__ import annotations

import jsonschema
import pytest

from guilds.toolbox.tools import FORMATS, TOOL_NAMES, export, schema_for, tool_specs
from guilds_code import limits
from guilds_code.protocol import ARG_SPECS, RequestError, validate_args

# The page's Reference table: tool -> its arguments, the required ones first.
PAGE_ARGS = {
    "code_task": ["brief", "repo", "session_id", "notes", "timeout_minutes"],
    "shell": ["command", "timeout_seconds", "background"],
    "shell_status": ["id", "stop", "wait", "until"],
    "file_read": ["path", "offset", "limit"],
    "code_search": ["pattern", "path", "glob", "mode", "fixed", "ignore_case", "context", "limit"],
}


def by_name():
    return {s.name: s for s in tool_specs()}


def test_the_five_tools_with_the_pages_arguments():
    specs = by_name()
    assert tuple(specs) == TOOL_NAMES == tuple(PAGE_ARGS)
    for name, args in PAGE_ARGS.items():
        schema = specs[name].input_schema
        assert list(schema["properties"]) == args
        assert schema["required"] == ([args[0]] if name != "shell_status" else [])
        assert schema["additionalProperties"] is False
        jsonschema.Draft202012Validator.check_schema(schema)
        assert len(specs[name].description) > 80
        assert all(p["description"] for p in schema["properties"].values())


def test_defaults_and_ranges_are_the_pages():
    props = {n: s.input_schema["properties"] for n, s in by_name().items()}
    assert props["shell"]["timeout_seconds"] == {
        "type": "integer", "default": 120, "minimum": 1, "maximum": 600,
        "description": props["shell"]["timeout_seconds"]["description"],
    }
    assert props["shell"]["background"]["default"] is False
    assert (props["file_read"]["offset"]["default"], props["file_read"]["offset"]["minimum"]) == (1, 1)
    assert "maximum" not in props["file_read"]["offset"]
    assert props["file_read"]["limit"]["default"] == limits.READ_LIMIT_DEFAULT == 200
    assert props["file_read"]["limit"]["maximum"] == limits.READ_LIMIT_MAX == 500
    assert props["code_search"]["mode"]["enum"] == ["files", "content"]
    assert props["code_search"]["mode"]["default"] == "files"
    assert (props["code_search"]["context"]["minimum"], props["code_search"]["context"]["maximum"]) == (0, 5)
    assert props["code_search"]["limit"]["maximum"] == 40 and "default" not in props["code_search"]["limit"]
    assert props["code_task"]["brief"]["type"] == "string"


@pytest.mark.parametrize("op", list(ARG_SPECS))
def test_schema_and_helper_agree_on_what_is_valid(op):
    """Whatever the schema accepts with its defaults filled in, the helper accepts too."""
    schema = schema_for(op)
    validator = jsonschema.Draft202012Validator(schema)
    filled = {k: p["default"] for k, p in schema["properties"].items() if "default" in p}
    for name in schema["required"]:
        filled[name] = "x"
    assert not list(validator.iter_errors(filled))
    assert validate_args(op, filled)
    for name, prop in schema["properties"].items():
        if "maximum" in prop:
            too_big = {**filled, name: prop["maximum"] + 1}
            assert list(validator.iter_errors(too_big))
            with pytest.raises(RequestError, match=name):
                validate_args(op, too_big)


def test_formats():
    spec = by_name()["shell"]
    assert export([spec], "anthropic") == [
        {"name": "shell", "description": spec.description, "input_schema": spec.input_schema}
    ]
    assert export([spec], "openai") == [
        {"type": "function",
         "function": {"name": "shell", "description": spec.description, "parameters": spec.input_schema}}
    ]
    (mcp,) = export([spec], "mcp")
    run = mcp["inputSchema"]["properties"].pop("run")
    assert mcp == {"name": "shell", "title": spec.hints.title, "description": spec.description,
                   "inputSchema": spec.input_schema, "annotations": {
                       "title": spec.hints.title, "readOnlyHint": False, "destructiveHint": True,
                       "idempotentHint": False, "openWorldHint": True}}
    assert run["type"] == "string" and "run" not in spec.input_schema["properties"]
    assert export([spec], "openai-responses") == [
        {"type": "function", "name": "shell", "description": spec.description, "parameters": spec.input_schema}
    ]
    assert sorted(FORMATS) == ["anthropic", "mcp", "openai", "openai-responses"]
