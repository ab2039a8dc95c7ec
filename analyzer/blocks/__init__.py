"""blocks stage: chained block hashes and the hashing salt (nothing else; the radix trees
are in :mod:`analyzer.cache`)."""

from analyzer.blocks.hashing import (
    BlockHasher,
    ChainState,
    chain_hashes_reference,
    id_hash,
    id_hashes,
)
from analyzer.blocks.salt import DEFAULT_SALT_FILE, load_salt, salt_id

__all__ = [
    "DEFAULT_SALT_FILE",
    "BlockHasher",
    "ChainState",
    "chain_hashes_reference",
    "id_hash",
    "id_hashes",
    "load_salt",
    "salt_id",
]
