"""One exception tree for the package: catch :class:`MemrlError` to catch anything memrl-mcp raises on purpose.

The tree, each class with the module that defines it (``tests/test_errors.py`` holds it against the code)::

    MemrlError                          errors
        AttachError                     local.place: no local server reached, started or used
            NotRunningError             local.attach: none runs, and none was to be started
            ToolCallError               local.client: a tool refused a call of the light client
        BackupError                     memory.archive: an export or import refused
        CalibrationError                embeddings.calibrate: unreadable or too little input to calibrate on
        DiskFullError                   storage.disk: a write would leave less than min_free_disk_mb
        EmbedderUnavailableError        embeddings.base: the embedder's optional package is not installed
        HookInputError                  clients.core: a hook event that is not the client's
        MemoryRequestError              errors: a request refused, nothing changed
            EpisodeGoneError            memory.steps: the episode's record went while it was reported
            NoAnswerError               surface.asking: the client did not answer the server's question
            QuotaExceededError          memory.admission: a namespace's quota would be passed
            RecallGoneError             memory.ledger: the recall went while it was reported
            RedactionError              redaction: the secret detector failed on a text, not stored unread
        MigrationNeededError            storage.migrations: a read-only server met an older schema
        ModelIntegrityError             embeddings.base: a model file missing, or not the one the package pins
        ReadOnlyError                   storage.layers: a write through a read-only store
        RefusalError                    transports.inspector: an inspector request refused (with its HTTP status)
        SchemaMarkerError               storage.migrations: the schema marker is damaged
        SchemaTooNewError               storage.migrations: the store was written by a newer memrl-mcp
        SettingsError                   settings.groups: a bad setting, named
        StoreLockedError                storage.store: another process holds the embedded store
        StoreMissingError               storage.store: no store where a read-only server looks
        StoreNotPrivateError            storage.private: another user's store is open to others
        StoreNotWritableError           storage.store: the store's folder cannot be written
        UncalibratedModelError          embeddings.base: a model without the similarity constants it needs
        WriteContentionError            memory.ledger: a conditional write lost too many races in a row

Outside the tree, on purpose: :class:`~memrl_mcp.surface.asking.InputRequiredError`, which ends a tool call of the
2026-07-28 protocol so that its client answers the server's question first (no error: the call goes on when the
client calls again), and must pass every ``except MemrlError`` on its way out.
"""


class MemrlError(Exception):
    """Base of every error memrl-mcp raises on purpose (a refused request, a bad setting, a locked store...)."""


class MemoryRequestError(MemrlError):
    """A request was refused (bad input, unknown or spent recall); nothing was changed. The message starts
    with the field it is about."""
