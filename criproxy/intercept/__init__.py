"""The proxy's door into the node agent (``nodeagent``): the runtime's ports over the proxy's gRPC channel, and the
interceptors that turn a CRI call's bytes into the agent's operations and its answers into edited bytes and forwarded
calls."""
