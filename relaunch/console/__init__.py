"""The Recovery Console: incidents, nodes, jobs and the audit trail on the web; approvals and
node resumes."""
