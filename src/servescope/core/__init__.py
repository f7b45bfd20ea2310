"""Types and small helpers shared by every feature package: errors, atomic writes, result documents."""
