"""A plugin module whose import itself fails (a dependency of the plugin is broken)."""

raise ImportError("the plugin's own dependency is broken")
