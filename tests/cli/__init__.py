"""The ``batchq`` command: arguments, help, operator commands, audit, demo, hostile
flags."""
