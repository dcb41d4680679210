package state

// InPod is the device's name inside the pod: the chosen rdmaDevName when it
// was renamed, else its host name.
func (r *Record) InPod() string {
	if r.PodName != "" {
		return r.PodName
	}
	return r.Device
}
