"""Parity tests: stratarl's RL math against an installed verl==0.9.1 (`make test-parity`)."""
