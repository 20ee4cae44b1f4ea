package poolcontroller

// DecodeMemory returns the reports a MemoryAnnotation value keeps, by node.
func DecodeMemory(value string) (map[string]string, error) {
	_, kept, err := decodeMemory(value)
	return kept, err
}
