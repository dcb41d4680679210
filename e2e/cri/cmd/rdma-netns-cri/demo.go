package main

func demo(args []string) error { return nil }
