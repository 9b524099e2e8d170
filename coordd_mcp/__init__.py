"""coordd-mcp: an MCP server (stdio) that lets LLM agents use coordd.

The server is a plain coordd client: it connects to coordd's Unix socket with the uid of
whoever launched it, so coordd's SO_PEERCRED admin check applies unchanged (an agent
launched by a uid outside the admin set cannot enqueue or cancel). Tools and their JSON
schemas are in `coordd_mcp.tools`; the stdio wiring is in `coordd_mcp.__main__`.
"""
