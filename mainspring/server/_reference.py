"""Render the API reference (docs/api-reference.md) from the OpenAPI document.

``python -m mainspring.server._reference > docs/api-reference.md``; a test checks that
the committed file matches, so the reference cannot drift from the code.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from .. import App
from ._api import create_app

__all__ = ["render_reference"]


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"[{_ref_name(schema['$ref'])}](#{_ref_name(schema['$ref']).lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if schema.get("type") == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "const" in schema:
        return f"`{schema['const']}`"
    return str(schema.get("type", "any"))


def render_reference(doc: dict[str, Any]) -> str:
    lines = [
        "# HTTP API reference",
        "",
        "Generated from the OpenAPI document by `python -m mainspring.server._reference`;",
        "do not edit by hand. The live document is at `/openapi.json` (and `/docs` with",
        "`--docs`) on a running `mainspring serve`. The guide is [http-api.md](http-api.md).",
        "",
        "Authentication: `Authorization: Bearer <key>` or `X-API-Key: <key>` on every",
        'endpoint but `/healthz`. Errors are `{"error": {"type", "message"}}`.',
        "",
        "## Endpoints",
        "",
    ]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            lines.append(f"### `{method.upper()} {path}`")
            lines.append("")
            summary = op.get("summary", "")
            description = " ".join(op.get("description", "").split())
            lines.append(f"**{summary}.** {description}".rstrip())
            lines.append("")
            params = op.get("parameters", [])
            if params:
                lines.append("| parameter | in | type | required |")
                lines.append("|---|---|---|---|")
                for p in params:
                    required = "yes" if p.get("required") else "no"
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {_type(p.get('schema', {}))} | {required} |"
                    )
                lines.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                lines.append(f"Body: {_type(body['schema'])}")
                lines.append("")
            responses = ", ".join(
                f"`{code}` {r.get('description', '')}".rstrip()
                for code, r in op.get("responses", {}).items()
            )
            lines.append(f"Responses: {responses}")
            lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        lines.append(f"### {name}")
        lines.append("")
        props = schema.get("properties", {})
        needed = set(schema.get("required", []))
        if props:
            lines.append("| field | type | required | description |")
            lines.append("|---|---|---|---|")
            for field, spec in props.items():
                desc = " ".join(str(spec.get("description", "")).split())
                need = "yes" if field in needed else "no"
                lines.append(f"| `{field}` | {_type(spec)} | {need} | {desc} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _app_doc() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        app = App(f"sqlite:///{Path(tmp) / 'reference.db'}")
        try:
            doc: dict[str, Any] = create_app(app, webhooks=False).openapi()
        finally:
            app.close()
    plain: dict[str, Any] = json.loads(json.dumps(doc))
    return plain


if __name__ == "__main__":
    print(render_reference(_app_doc()), end="")
