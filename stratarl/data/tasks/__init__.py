"""Layer 5, data: synthetic tasks written as verl-schema parquet, each scored by a registered reward."""
