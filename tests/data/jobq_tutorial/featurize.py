#!/usr/bin/env python3
from dagq.jobq import set_output

print("Featurizing...")
set_output({"path": "/tmp/features.parquet", "rows": 50000})
print("Done.")
