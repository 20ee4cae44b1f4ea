package poolcontroller

import "encoding/json"

// DecodeMemory returns the reports a MemoryAnnotation value keeps, by node.
func DecodeMemory(value string) (map[string]string, error) {
	_, kept, err := decodeMemory(value)
	return kept, err
}

// EncodeMemory returns the MemoryAnnotation value that keeps reports.
func EncodeMemory(reports map[string]string) (string, error) {
	b, err := json.Marshal(reports)
	if err != nil {
		return "", err
	}
	return encodeMemory(string(b))
}
