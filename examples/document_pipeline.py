"""The document pipeline of document_pipeline.yaml, written in Python.

Run it the same way:  dagq run examples/document_pipeline.py
It builds exactly the same definition as the YAML file (a test checks that).
"""

from dagq import Workflow

SHARDS = 8

workflow = Workflow(
    "document-pipeline",
    params={"documents": 24, "language": "en", "contract_threshold": 100},
    default_task_timeout_s=120,
    defaults={"num_retries": 2, "retry": {"backoff_s": 0.2, "backoff_multiplier": 2, "jitter": 0.2}},
)

extract = workflow.call(
    "extract",
    "docpipe:extract",
    args={"count": "{{ params.documents }}", "language": "{{ params.language }}"},
)
classify = workflow.call("classify", "docpipe:classify", depends_on=[extract])
invoices = workflow.call(
    "invoices",
    "docpipe:process_invoices",
    depends_on=[classify],
    condition="inputs.classify.invoices > 0",
)
contracts = workflow.call(
    "contracts",
    "docpipe:review_contracts",
    depends_on=[classify],
    condition="inputs.classify.contracts > params.contract_threshold",
)
enrich = workflow.call("enrich", "docpipe:enrich", depends_on=[classify])
ocr = [
    workflow.call(
        f"ocr-{i}", "docpipe:ocr_shard", depends_on=[extract], args={"shard": i, "shards": SHARDS}
    )
    for i in range(SHARDS)
]
workflow.call("report", "docpipe:report", depends_on=[invoices, contracts, enrich, *ocr])
