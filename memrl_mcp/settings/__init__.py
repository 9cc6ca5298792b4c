"""Settings: defaults from the papers, a YAML file, environment variables and explicit values, grouped by concern.

Every setting has one name (``k1``, ``data_dir``, ``step_n``...), unique across the groups, and belongs to one group:
``storage``, ``embeddings``, ``similarity``, ``retrieval``, ``learning``, ``steps``, ``limits``, ``namespaces``,
``serving``. Each part of the server takes its own group (the store its :class:`StorageSettings`, the embedder its
:class:`EmbeddingSettings`...), never the whole configuration.

Where a value comes from, highest first:

1. an explicit value: ``load_settings(k1=3)``, or the command line's ``--data-dir``;
2. the environment: ``MEMRL_<NAME>`` (``MEMRL_K1=3``; lists and objects as JSON), and for three settings the names
   the Qdrant ecosystem uses (``QDRANT_URL``, ``QDRANT_API_KEY``, ``COLLECTION_NAME``), which ``MEMRL_*`` overrides;
3. the YAML file (``--config FILE``, else ``MEMRL_CONFIG``), where each setting sits under its group
   (``retrieval: {k1: 3}``);
4. the default.

The variables' names are kept in :mod:`memrl_mcp.variables` (the attaching side of the local server sends a session's
own to the server without loading the settings).

A bad value is refused with its name and where it came from; so is an unknown name (a ``MEMRL_*`` variable, a YAML
key, an argument), with the closest known one: a typo must not silently leave a default in place.
:meth:`Settings.origin` says where each value came from (``memrl-mcp config`` prints them all).

The package: :mod:`~memrl_mcp.settings.groups` (the memory's groups), :mod:`~memrl_mcp.settings.serving` (the
serving group, tokens and tool profiles), :mod:`~memrl_mcp.settings.loading` (the whole, its sources, as YAML).
"""

from memrl_mcp.settings.groups import (
    ALL_NAMESPACES,
    MIN_TOKEN_CHARS,
    RENAMED,
    EmbeddingSettings,
    Group,
    LearningSettings,
    LimitSettings,
    NamespaceSettings,
    RetrievalSettings,
    SettingsError,
    SimilaritySettings,
    StepSettings,
    StorageSettings,
    unknown_name,
)
from memrl_mcp.settings.loading import (
    GROUP_OF,
    GROUPS,
    Settings,
    as_yaml,
    load_settings,
)
from memrl_mcp.settings.serving import (
    CORE_TOOLS,
    STEP_TOOLS,
    TOOL_PROFILES,
    ServingSettings,
    TokenGrant,
    ToolProfile,
    grant_digest,
    load_grants,
)
from memrl_mcp.variables import ECOSYSTEM_VARIABLES, ENV_PREFIX, OTHER_VARIABLES

__all__ = [
    "ALL_NAMESPACES",
    "CORE_TOOLS",
    "ECOSYSTEM_VARIABLES",
    "ENV_PREFIX",
    "GROUPS",
    "GROUP_OF",
    "MIN_TOKEN_CHARS",
    "OTHER_VARIABLES",
    "RENAMED",
    "STEP_TOOLS",
    "TOOL_PROFILES",
    "EmbeddingSettings",
    "Group",
    "LearningSettings",
    "LimitSettings",
    "NamespaceSettings",
    "RetrievalSettings",
    "ServingSettings",
    "Settings",
    "SettingsError",
    "SimilaritySettings",
    "StepSettings",
    "StorageSettings",
    "TokenGrant",
    "ToolProfile",
    "as_yaml",
    "grant_digest",
    "load_grants",
    "load_settings",
    "unknown_name",
]
