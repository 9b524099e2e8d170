"""`coordd-mcp [--socket PATH] [--agent NAME] [--timeout S]`: coordd's MCP server on stdio.

An MCP client (a coding agent) launches it as a subprocess and speaks JSON-RPC over its
stdin/stdout; logs go to stderr only. `--agent` is the name this agent sends, reads and
reports status as (default `$COORD_AGENT`, else `mcp:<login>`); the socket comes from
`--socket`, else `$COORDD_SOCKET`, else the per-user default, as for coordctl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from coordd.client import CALL_TIMEOUT_DEFAULT, Client
from coordd.paths import default_agent_name
from coordd_mcp.tools import TOOLS, ToolFailure, call

logger = logging.getLogger("coordd_mcp")

INSTRUCTIONS = (
    "coordd coordinates AI jobs across this operator's machines and carries messages "
    "between agents. Enqueue a job, then wait_for_job and read its result. Messages are "
    "delivered at least once: pass the ids you have handled as `ack` to your next "
    "read_messages (or call ack_messages), or they come back after the visibility timeout. "
    "Errors start with a stable code such as bad_request or permission_denied."
)


def build_server(client: Client, agent: str) -> Server[Any, Any]:
    """The MCP server: every tool of coordd_mcp.tools, answered through `client`."""
    server: Server[Any, Any] = Server("coordd", instructions=INSTRUCTIONS)

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return [types.Tool(name=t.name, description=t.description, inputSchema=t.schema,
                           annotations=types.ToolAnnotations(readOnlyHint=t.read_only))
                for t in TOOLS]

    # Our own schema check names the field in its message; the SDK's does not.
    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any] | None) -> Any:
        try:
            result = await call(client, agent, name, arguments)
        except ToolFailure as exc:
            logger.info("tool %s failed: %s", name, exc.text)
            return tool_error(exc.text)
        try:
            text = json.dumps(result, indent=2, ensure_ascii=False)
            reply = types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                         structuredContent=result if isinstance(result, dict)
                                         else {"result": result}, isError=False)
            check_serializable(reply)
        except Exception as exc:  # the SDK would fail after we return, and stop serving
            logger.warning("tool %s: result cannot be sent over MCP: %s", name, exc)
            return tool_error(f"internal: {name}: the result cannot be sent over MCP "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")
        return reply

    return server


def tool_error(text: str) -> types.CallToolResult:
    """An MCP tool error (`isError`) whose text is `text`."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                isError=True)


def check_serializable(result: types.CallToolResult) -> None:
    """Serialize `result` as the SDK will once the handler returns (the JSON-RPC response
    on stdout), so what it cannot serialize (e.g. a value nested past pydantic's depth
    limit) fails here, as one tool error, instead of inside the SDK, which ends the server.

    Raises:
        Exception: whatever pydantic raises (PydanticSerializationError, ValueError, ...).
    """
    body = types.ServerResult(result).model_dump(by_alias=True, mode="json", exclude_none=True)
    types.JSONRPCMessage(types.JSONRPCResponse(jsonrpc="2.0", id=0, result=body)
                         ).model_dump_json(by_alias=True, exclude_none=True)


async def serve(socket_path: str | None, agent: str, timeout: float) -> None:
    """Serve MCP on stdin/stdout until the client closes it."""
    client = Client(socket_path, timeout=timeout)
    server = build_server(client, agent)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await client.close()


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `coordd-mcp` console script."""
    p = argparse.ArgumentParser(
        prog="coordd-mcp",
        description="coordd's MCP server. An MCP client (a coding agent) launches it and "
                    "speaks MCP over its stdin/stdout; it is not run by hand. It talks to "
                    "coordd over coordd's socket and logs to stderr.")
    p.add_argument("--socket", metavar="PATH",
                   help="coordd socket (default: $COORDD_SOCKET, else the per-user path)")
    p.add_argument("--agent", metavar="NAME", default=None,
                   help="this agent's name (default: $COORD_AGENT, else mcp:<login>)")
    p.add_argument("--timeout", metavar="S", type=_positive, default=CALL_TIMEOUT_DEFAULT,
                   help=f"seconds to wait for each coordd reply (default {CALL_TIMEOUT_DEFAULT:g})")
    args = p.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="coordd-mcp: %(levelname)s %(message)s")
    try:
        asyncio.run(serve(args.socket, args.agent or default_agent_name("mcp"), args.timeout))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
