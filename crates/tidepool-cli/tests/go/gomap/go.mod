module gomap
go 1.22
