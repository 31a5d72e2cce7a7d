"""numapin's admission webhook: mutates pods with their CPU intent, admits pods and bindings by topology."""
