//go:build !linux && !darwin && !windows

package main

func newServiceManager() (serviceManager, error) { return nil, errNoServiceManager }
