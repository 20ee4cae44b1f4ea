package nicdiscovery

// VFStatesOf exposes the conversion of a PF's netlink VF list to tests.
var VFStatesOf = vfStates
