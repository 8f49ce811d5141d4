package wire

// The broker's service (micro service "gantry-broker"), answered by the
// process that embeds the broker (`gantry run`, `gantry broker`).
const (
	// SubjectBrokerHealth asks the broker whether it can store what it is
	// sent: an empty request, answered by BrokerHealth. A client whose
	// publish got no answer asks it to say why.
	SubjectBrokerHealth = "gantry.api.broker.health"
	// BrokerServiceName is the micro service the broker registers.
	BrokerServiceName = "gantry-broker"
)

// BrokerHealth is the reply on SubjectBrokerHealth.
type BrokerHealth struct {
	// StorageOK is false while the broker's store cannot be written: a
	// write failed (the disk was full) and JetStream has not been
	// restarted yet, or its data dir has less room than it needs.
	StorageOK bool `json:"storage_ok"`
	// Error says what is wrong when StorageOK is false.
	Error string `json:"error,omitempty"`
	// FreeBytes is the room left in the broker's data dir.
	FreeBytes uint64 `json:"free_bytes"`
}
