package ipvs

// ThreadCPU lets the external tests spend the drift check's own measure of
// CPU time (a listing made to cost CPU, as a real kernel's does).
var ThreadCPU = threadCPU
