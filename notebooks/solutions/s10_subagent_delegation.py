def read_only_tools(parent_tools):
    """The file and terminal tools a child may have, minus those that change anything."""
    offered = s10.child_tools(parent_tools, ["file", "terminal"])
    return [tool for tool in offered if not s10.REGISTRY.get(tool["function"]["name"]).mutates]
