"""blocks stage: chained block hashes, the hashing salt, and the token radix tree."""

from analyzer.blocks.hashing import (
    BlockHasher,
    ChainState,
    chain_hashes_reference,
    id_hash,
    id_hashes,
)
from analyzer.blocks.radix import ArrivalLCP, TokenRadix, lcp_reference
from analyzer.blocks.salt import DEFAULT_SALT_FILE, load_salt, salt_id

__all__ = [
    "DEFAULT_SALT_FILE",
    "ArrivalLCP",
    "BlockHasher",
    "ChainState",
    "TokenRadix",
    "chain_hashes_reference",
    "id_hash",
    "id_hashes",
    "lcp_reference",
    "load_salt",
    "salt_id",
]
